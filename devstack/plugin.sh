#!/bin/bash
# shellcheck shell=bash
# plugin.sh - DevStack plugin for trusted-cloud: the registrar and the cloud
# verifier (and, optionally, a node agent on this host).
#
# The plugin contract: https://docs.openstack.org/devstack/latest/plugins.html
# DevStack sources this file with the mode and phase as $1 and $2, in the
# shell that already holds its function library (iniset, run_process, ...),
# its globals (DEST, DATA_DIR, SERVICE_HOST, STACK_USER, NOVA_CONF, ...) and
# the values of devstack/settings. (The linter takes upper-case names for
# environment variables, so these need no SC2154 exception.)

_XTRACE_TRUSTED_CLOUD=$(set +o | grep xtrace)
set -o xtrace

TRUSTED_BIN_DIR=${TRUSTED_BIN_DIR:-$(get_python_exec_prefix)}
TRUSTED_REGISTRAR_CONF=$TRUSTED_CLOUD_CONF_DIR/registrar.conf
TRUSTED_VERIFIER_CONF=$TRUSTED_CLOUD_CONF_DIR/verifier.conf
TRUSTED_AGENT_CONF=$TRUSTED_CLOUD_CONF_DIR/agent.conf
TRUSTED_TENANT_RC=$TRUSTED_CLOUD_CONF_DIR/tenantrc

# install_trusted_cloud - the TSS headers tpm2-pytss builds against, then
# the project in develop mode (console scripts trusted-*) with the extras of
# the enabled services: server (registrar, verifier), agent
function install_trusted_cloud {
    install_package libtss2-dev pkg-config
    local extras=server
    if is_service_enabled trusted-agent; then
        extras+=",agent"
    fi
    if is_service_enabled horizon; then
        extras+=",dashboard"
    fi
    setup_develop "$TRUSTED_CLOUD_DIR" "$extras"
    # configure_keystone_authtoken_middleware sets memcached_servers: its
    # client library, which the server extra does not bring (without it
    # the services refuse to start: doc/source/admin/tenancy.rst)
    pip_install python-memcached
}

# _trusted_cloud_pki - the operator CA and one mTLS certificate per party
# (its common name is the role the services grant), plus the CA that issues
# node identities
function _trusted_cloud_pki {
    "$TRUSTED_BIN_DIR/trusted-certs" --dir "$TRUSTED_CLOUD_PKI_DIR" \
        --hosts "$TRUSTED_CERT_HOSTS" registrar verifier tenant agent admin
    # trusted-certs creates the CA (ca.pem, ca-key.pem) the verifier loads
    # from ca_dir; it wants one certificate name, which is not used.
    "$TRUSTED_BIN_DIR/trusted-certs" --dir "$TRUSTED_CLOUD_NODE_CA_DIR" \
        --hosts "$TRUSTED_CERT_HOSTS" unused
}

function _configure_trusted_registrar {
    local conf=$TRUSTED_REGISTRAR_CONF
    iniset "$conf" DEFAULT debug "$ENABLE_DEBUG_LOG_LEVEL"
    iniset "$conf" registrar host "$TRUSTED_REGISTRAR_HOST"
    iniset "$conf" registrar port "$TRUSTED_REGISTRAR_PORT"
    iniset "$conf" registrar database_connection \
        "sqlite:///$TRUSTED_CLOUD_DATA_DIR/registrar.sqlite"
    iniset "$conf" registrar cert_file "$TRUSTED_CLOUD_PKI_DIR/registrar.pem"
    iniset "$conf" registrar key_file "$TRUSTED_CLOUD_PKI_DIR/registrar-key.pem"
    iniset "$conf" registrar ca_file "$TRUSTED_CLOUD_PKI_DIR/ca.pem"
    if [[ -n "$TRUSTED_EK_CA_BUNDLE" ]]; then
        iniset "$conf" registrar ek_ca_bundle "$TRUSTED_EK_CA_BUNDLE"
    fi
    iniset "$conf" registrar require_ek_certificate "$TRUSTED_REQUIRE_EK_CERTIFICATE"
    # required once the compute hosts run a host agent the verifier attests
    iniset "$conf" registrar host_trust "$TRUSTED_REGISTRAR_HOST_TRUST"
    if is_service_enabled key; then
        # tenants read their instances' registrations with Keystone tokens
        iniset "$conf" registrar auth_strategy keystone
        configure_keystone_authtoken_middleware "$conf" attestation
    else
        iniset "$conf" registrar auth_strategy noauth
    fi
}

function _configure_trusted_verifier {
    local conf=$TRUSTED_VERIFIER_CONF
    iniset "$conf" DEFAULT debug "$ENABLE_DEBUG_LOG_LEVEL"
    iniset "$conf" verifier host "$TRUSTED_VERIFIER_HOST"
    iniset "$conf" verifier port "$TRUSTED_VERIFIER_PORT"
    iniset "$conf" verifier database_connection \
        "sqlite:///$TRUSTED_CLOUD_DATA_DIR/verifier.sqlite"
    iniset "$conf" verifier cert_file "$TRUSTED_CLOUD_PKI_DIR/verifier.pem"
    iniset "$conf" verifier key_file "$TRUSTED_CLOUD_PKI_DIR/verifier-key.pem"
    iniset "$conf" verifier ca_file "$TRUSTED_CLOUD_PKI_DIR/ca.pem"
    iniset "$conf" verifier registrar_url \
        "https://$TRUSTED_REGISTRAR_HOST:$TRUSTED_REGISTRAR_PORT"
    iniset "$conf" verifier quote_interval "$TRUSTED_QUOTE_INTERVAL"
    iniset "$conf" verifier signing_key \
        "$TRUSTED_CLOUD_CONF_DIR/event-signing-key.pem"
    iniset "$conf" verifier ca_dir "$TRUSTED_CLOUD_NODE_CA_DIR"
    iniset "$conf" verifier notifiers "$TRUSTED_NOTIFIERS"
    if is_service_enabled key; then
        # tenants authenticate with Keystone tokens (no tenant certificate)
        iniset "$conf" verifier auth_strategy keystone
        configure_keystone_authtoken_middleware "$conf" attestation
    else
        iniset "$conf" verifier auth_strategy noauth
    fi
    _configure_trusted_placement "$conf"
    # agents that nobody can reach push their evidence here (push mode)
    iniset "$conf" push port "$TRUSTED_PUSH_PORT"
    iniset "$conf" revocation_hooks actions "$TRUSTED_REVOCATION_ACTIONS"
    iniset "$conf" action_log record_file \
        "$TRUSTED_CLOUD_DATA_DIR/revocations.jsonl"
}

# Trusted compute pools (doc/source/admin/compute-pools.rst): the verifier
# keeps CUSTOM_ATTESTATION_TRUSTED on each attested compute host's resource
# provider, as the attestation service user (Placement lets its service
# role change traits).
function _configure_trusted_placement {
    local conf=$1
    if [[ "$TRUSTED_PLACEMENT_TRAITS" != "True" ]] \
            || ! is_service_enabled placement-api || ! is_service_enabled key; then
        return
    fi
    iniset "$conf" placement trait_sync True
    iniset "$conf" placement auth_type password
    iniset "$conf" placement auth_url "$KEYSTONE_SERVICE_URI"
    iniset "$conf" placement username attestation
    iniset "$conf" placement password "$SERVICE_PASSWORD"
    iniset "$conf" placement user_domain_name "$SERVICE_DOMAIN_NAME"
    iniset "$conf" placement project_name "$SERVICE_PROJECT_NAME"
    iniset "$conf" placement project_domain_name "$SERVICE_DOMAIN_NAME"
    iniset "$conf" placement region_name "$REGION_NAME"
}

function _configure_trusted_agent {
    local conf=$TRUSTED_AGENT_CONF
    local uuid_file=$TRUSTED_CLOUD_DATA_DIR/agent-uuid
    if [[ -z "$TRUSTED_AGENT_UUID" ]]; then
        if [[ ! -s "$uuid_file" ]]; then
            cat /proc/sys/kernel/random/uuid > "$uuid_file"
        fi
        TRUSTED_AGENT_UUID=$(cat "$uuid_file")
    fi
    iniset "$conf" DEFAULT debug "$ENABLE_DEBUG_LOG_LEVEL"
    iniset "$conf" agent uuid "$TRUSTED_AGENT_UUID"
    iniset "$conf" agent tcti "$TRUSTED_AGENT_TCTI"
    iniset "$conf" agent host "$TRUSTED_AGENT_HOST"
    iniset "$conf" agent port "$TRUSTED_AGENT_PORT"
    iniset "$conf" agent registrar_url \
        "https://$TRUSTED_REGISTRAR_HOST:$TRUSTED_REGISTRAR_PORT"
    iniset "$conf" agent ca_file "$TRUSTED_CLOUD_PKI_DIR/ca.pem"
    iniset "$conf" agent cert_file "$TRUSTED_CLOUD_PKI_DIR/agent.pem"
    iniset "$conf" agent key_file "$TRUSTED_CLOUD_PKI_DIR/agent-key.pem"
    iniset "$conf" agent work_dir "$TRUSTED_CLOUD_DATA_DIR/agent"
    if [[ "$TRUSTED_PUSH_PORT" != "0" ]]; then
        # where the agent would push (attestation_mode push); pull stays the default
        iniset "$conf" agent push_url \
            "https://$TRUSTED_VERIFIER_HOST:$TRUSTED_PUSH_PORT"
    fi
}

# _configure_nova_notifications - versioned notifications on the message
# bus, which the Nova listener of trusted-cloud consumes
function _configure_nova_notifications {
    iniset "$NOVA_CONF" notifications notification_format versioned
    iniset "$NOVA_CONF" oslo_messaging_notifications driver messagingv2
}

# _create_trusted_accounts - the verifier's service user, and its catalog
# entry (service type attestation) with its endpoint, so that tenants'
# clients (openstack attestation ..., trusted-nova boot) find it
function _create_trusted_accounts {
    create_service_user "attestation"
    get_or_create_service "attestation" "attestation" \
        "Trusted cloud attestation (verifier)"
    get_or_create_endpoint "attestation" "$REGION_NAME" \
        "https://$TRUSTED_VERIFIER_HOST:$TRUSTED_VERIFIER_PORT"
}

# _configure_trusted_dashboard - Horizon's attestation panels: their enabled
# files into Horizon's local/enabled, and the API's policy rules into
# Horizon's policy directory (POLICY_FILES["attestation"], which the
# plugin's application points at: doc/source/admin/dashboard.rst)
function _configure_trusted_dashboard {
    local src=$TRUSTED_CLOUD_DIR/attestation_dashboard
    local enabled=$HORIZON_DIR/openstack_dashboard/local/enabled
    mkdir -p "$enabled"
    cp "$src"/enabled/_[0-9]*.py "$enabled/"
    cp "$src/conf/attestation_policy.yaml" "$HORIZON_DIR/openstack_dashboard/conf/"
}

# configure_trusted_cloud - directories, certificates, configuration files
# and the sample configuration of every option
function configure_trusted_cloud {
    sudo install -d -o "$STACK_USER" -m 755 "$TRUSTED_CLOUD_CONF_DIR"
    sudo install -d -o "$STACK_USER" -m 700 "$TRUSTED_CLOUD_DATA_DIR"
    _trusted_cloud_pki
    if is_service_enabled trusted-registrar; then
        _configure_trusted_registrar
    fi
    if is_service_enabled trusted-verifier; then
        _configure_trusted_verifier
        if is_service_enabled key; then
            _create_trusted_accounts
        fi
    fi
    if is_service_enabled trusted-agent; then
        _configure_trusted_agent
    fi
    "$TRUSTED_BIN_DIR/oslo-config-generator" \
        --config-file "$TRUSTED_CLOUD_DIR/etc/trusted-cloud-config-generator.conf" \
        --output-file "$TRUSTED_CLOUD_CONF_DIR/trusted-cloud.conf.sample"
    # the alerting rules for the operator's Prometheus
    # (doc/source/admin/monitoring.rst)
    install -d -m 755 "$TRUSTED_CLOUD_CONF_DIR/prometheus"
    cp "$TRUSTED_CLOUD_DIR/etc/prometheus/trusted-cloud.rules.yml" \
        "$TRUSTED_CLOUD_CONF_DIR/prometheus/"
    if is_service_enabled horizon; then
        _configure_trusted_dashboard
    fi
    if [[ "$TRUSTED_CONFIGURE_NOVA" == "True" ]] && is_service_enabled nova; then
        _configure_nova_notifications
    fi
}

# configure_trusted_cloud_tests - the environment trusted-tenant reads, for
# tests and for the operator, and the service flag for Tempest
function configure_trusted_cloud_tests {
    cat > "$TRUSTED_TENANT_RC" <<RC
export TRUSTED_REGISTRAR_URL=https://$TRUSTED_REGISTRAR_HOST:$TRUSTED_REGISTRAR_PORT
export TRUSTED_VERIFIER_URL=https://$TRUSTED_VERIFIER_HOST:$TRUSTED_VERIFIER_PORT
export TRUSTED_CERT=$TRUSTED_CLOUD_PKI_DIR/tenant.pem
export TRUSTED_KEY=$TRUSTED_CLOUD_PKI_DIR/tenant-key.pem
export TRUSTED_CA=$TRUSTED_CLOUD_PKI_DIR/ca.pem
RC
    if is_service_enabled tempest; then
        iniset "$TEMPEST_CONFIG" service_available trusted_cloud True
    fi
}

# _trusted_wait_for_port - wait until something accepts TCP connections on
# host:port. DevStack's wait_for_service cannot be used: the services demand
# a client certificate, so its curl probe never completes a handshake.
function _trusted_wait_for_port {
    local host=$1 port=$2
    local deadline=$((SECONDS + ${SERVICE_TIMEOUT:-60}))
    until (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            die $LINENO "nothing listens on $host:$port after ${SERVICE_TIMEOUT:-60}s"
        fi
        sleep 0.5
    done
}

# _trusted_install_unit service conf - the shipped unit of service
# (etc/systemd/<service>.service) in TRUSTED_SYSTEMD_DIR, with a drop-in that
# points it at this DevStack: its user, its scripts and configuration file,
# and its data and configuration directories writable (the verifier writes
# its event-signing key there)
function _trusted_install_unit {
    local service=$1 conf=$2
    local unit=$TRUSTED_SYSTEMD_DIR/$service.service
    local dropin
    dropin=$(mktemp)
    cat > "$dropin" <<UNIT
[Service]
User=$STACK_USER
Group=$(id -gn "$STACK_USER")
SupplementaryGroups=
ExecStart=
ExecStart=$TRUSTED_BIN_DIR/$service --config-file $conf
ReadWritePaths=$TRUSTED_CLOUD_DATA_DIR $TRUSTED_CLOUD_CONF_DIR
UNIT
    sudo install -m 644 "$TRUSTED_CLOUD_DIR/etc/systemd/$service.service" "$unit"
    sudo install -d -m 755 "$unit.d"
    sudo install -m 644 "$dropin" "$unit.d/devstack.conf"
    rm -f "$dropin"
}

# _trusted_start service conf - run the service: under its shipped unit
# (TRUSTED_SYSTEMD_UNITS=True) or DevStack's devstack@ unit (run_process)
function _trusted_start {
    local service=$1 conf=$2
    if [[ "$TRUSTED_SYSTEMD_UNITS" == "True" ]]; then
        _trusted_install_unit "$service" "$conf"
        sudo systemctl daemon-reload
        sudo systemctl enable --now "$service.service"
    else
        run_process "$service" "$TRUSTED_BIN_DIR/$service --config-file $conf"
    fi
}

# start_trusted_cloud - the registrar first (the verifier and the agent call
# it), then the verifier, then the agent
function start_trusted_cloud {
    if is_service_enabled trusted-registrar; then
        _trusted_start trusted-registrar "$TRUSTED_REGISTRAR_CONF"
        _trusted_wait_for_port "$TRUSTED_REGISTRAR_HOST" "$TRUSTED_REGISTRAR_PORT"
    fi
    if is_service_enabled trusted-verifier; then
        _trusted_start trusted-verifier "$TRUSTED_VERIFIER_CONF"
        _trusted_wait_for_port "$TRUSTED_VERIFIER_HOST" "$TRUSTED_VERIFIER_PORT"
    fi
    if is_service_enabled trusted-agent; then
        _trusted_start trusted-agent "$TRUSTED_AGENT_CONF"
    fi
}

# stop_trusted_cloud - in the reverse order of start
function stop_trusted_cloud {
    local service
    for service in trusted-agent trusted-verifier trusted-registrar; do
        if ! is_service_enabled "$service"; then
            continue
        fi
        if [[ "$TRUSTED_SYSTEMD_UNITS" == "True" ]]; then
            sudo systemctl stop "$service.service"
        else
            stop_process "$service"
        fi
    done
}

# cleanup_trusted_cloud - configuration, keys, certificates and databases
function cleanup_trusted_cloud {
    sudo rm -rf "$TRUSTED_CLOUD_CONF_DIR" "$TRUSTED_CLOUD_DATA_DIR"
    if [[ "$TRUSTED_SYSTEMD_UNITS" == "True" ]]; then
        local service
        for service in trusted-agent trusted-verifier trusted-registrar; do
            if [[ -e "$TRUSTED_SYSTEMD_DIR/$service.service" ]]; then
                sudo systemctl disable "$service.service"
                sudo rm -rf "$TRUSTED_SYSTEMD_DIR/$service.service" \
                    "$TRUSTED_SYSTEMD_DIR/$service.service.d"
            fi
        done
        sudo systemctl daemon-reload
    fi
}

if is_service_enabled trusted-registrar trusted-verifier trusted-agent; then
    if [[ "$1" == "stack" && "$2" == "install" ]]; then
        echo_summary "Installing trusted-cloud"
        install_trusted_cloud
    elif [[ "$1" == "stack" && "$2" == "post-config" ]]; then
        echo_summary "Configuring trusted-cloud"
        configure_trusted_cloud
    elif [[ "$1" == "stack" && "$2" == "extra" ]]; then
        echo_summary "Starting trusted-cloud"
        start_trusted_cloud
    elif [[ "$1" == "stack" && "$2" == "test-config" ]]; then
        echo_summary "Configuring trusted-cloud tests"
        configure_trusted_cloud_tests
    fi

    if [[ "$1" == "unstack" ]]; then
        stop_trusted_cloud
    fi

    if [[ "$1" == "clean" ]]; then
        cleanup_trusted_cloud
    fi
fi

$_XTRACE_TRUSTED_CLOUD
