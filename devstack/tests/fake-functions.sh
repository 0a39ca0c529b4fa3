#!/bin/bash
# shellcheck shell=bash
# A stand-in for DevStack's function library (functions, functions-common,
# inc/ini-config, inc/python), for testing plugin.sh where DevStack itself
# cannot run: verifier/tests/functional/test_devstack_plugin.py sources it,
# then ../settings, then ../plugin.sh with a mode and phase.
#
# Every function with an effect appends one line to $FAKE_DEVSTACK_LOG: its
# name and its arguments, shell-quoted with printf %q. iniset really writes
# the ini file, sudo really runs its command (as the current user), and
# run_process really starts the services named in $FAKE_DEVSTACK_RUN (a
# comma-separated list) in their own session, with their PID in
# $FAKE_DEVSTACK_DIR/pids/<service> and their output in
# $FAKE_DEVSTACK_DIR/<service>.log; other services are only recorded.
#
# Inputs: FAKE_DEVSTACK_LOG, FAKE_DEVSTACK_DIR, FAKE_DEVSTACK_BIN (what
# get_python_exec_prefix prints), FAKE_DEVSTACK_PYTHON (runs iniset),
# FAKE_DEVSTACK_RUN, ENABLED_SERVICES, DISABLED_SERVICES.

function _fake_record {
    local line
    line=$(printf '%q ' "$@")
    echo "${line% }" >> "$FAKE_DEVSTACK_LOG"
}

# DevStack: returns 0 if any of the named services is enabled; "nova" stands
# for any n-* service.
function is_service_enabled {
    local service
    for service in "$@"; do
        [[ ",${ENABLED_SERVICES}," == *",${service},"* ]] && return 0
        [[ "$service" == nova && ",${ENABLED_SERVICES}" == *",n-"* ]] && return 0
    done
    return 1
}

# DevStack: adds services to ENABLED_SERVICES unless local.conf disabled them.
function enable_service {
    _fake_record enable_service "$@"
    local service
    for service in "$@"; do
        if [[ ",${DISABLED_SERVICES:-}," == *",${service},"* ]]; then
            continue
        fi
        is_service_enabled "$service" || ENABLED_SERVICES+=",$service"
    done
}

# DevStack: prints True or False for the variable named $2, or $1 if unset.
function trueorfalse {
    local default=$1
    local testval=${!2:-}
    case "$testval" in
        1 | [yY]es | YES | [tT]rue | TRUE) echo True ;;
        0 | [nN]o | NO | [fF]alse | FALSE) echo False ;;
        *) echo "$default" ;;
    esac
}

# DevStack: iniset [-sudo] file section option value
function iniset {
    _fake_record iniset "$@"
    [[ "$1" == -sudo ]] && shift
    "$FAKE_DEVSTACK_PYTHON" - "$@" <<'PY'
import configparser
import sys

path, section, option, value = sys.argv[1:5]
parser = configparser.ConfigParser(interpolation=None)
parser.optionxform = str
parser.read(path)
if section != "DEFAULT" and not parser.has_section(section):
    parser.add_section(section)
parser.set(section, option, value)
with open(path, "w") as f:
    parser.write(f)
PY
}

function get_python_exec_prefix {
    echo "$FAKE_DEVSTACK_BIN"
}

function sudo {
    _fake_record sudo "$@"
    "$@"
}

function setup_develop {
    _fake_record setup_develop "$@"
}

function install_package {
    _fake_record install_package "$@"
}

function pip_install {
    _fake_record pip_install "$@"
}

function echo_summary {
    _fake_record echo_summary "$@"
    echo "$@"
}

function die {
    _fake_record die "$@"
    echo "die (line $1): ${*:2}" >&2
    exit 1
}

# DevStack: run_process service "command line" [group] [user]
function run_process {
    _fake_record run_process "$@"
    local service=$1 command=$2
    if [[ ",${FAKE_DEVSTACK_RUN:-}," == *",${service},"* ]]; then
        mkdir -p "$FAKE_DEVSTACK_DIR/pids"
        # Word splitting is what DevStack does with the command line too.
        # shellcheck disable=SC2086
        setsid $command > "$FAKE_DEVSTACK_DIR/$service.log" 2>&1 &
        echo $! > "$FAKE_DEVSTACK_DIR/pids/$service"
    fi
}

function stop_process {
    _fake_record stop_process "$@"
    local pidfile=$FAKE_DEVSTACK_DIR/pids/$1
    local pid tries=100
    if [[ -f "$pidfile" ]]; then
        pid=$(cat "$pidfile")
        kill -TERM "$pid" 2>/dev/null || true
        # Like systemctl stop: return once the process is gone.
        while kill -0 "$pid" 2>/dev/null && ((tries-- > 0)); do
            sleep 0.1
        done
        rm -f "$pidfile"
    fi
}

# DevStack (lib/keystone): the service user, catalog entries and the
# [keystone_authtoken] section; recorded only (no Keystone here).
function create_service_user {
    _fake_record create_service_user "$@"
}

function get_or_create_service {
    _fake_record get_or_create_service "$@"
}

function get_or_create_endpoint {
    _fake_record get_or_create_endpoint "$@"
}

function configure_keystone_authtoken_middleware {
    _fake_record configure_keystone_authtoken_middleware "$@"
}

# systemctl (TRUSTED_SYSTEMD_UNITS=True): recorded; "enable --now" and
# "start" of a service named in $FAKE_DEVSTACK_RUN really start the command
# line of the unit's last ExecStart= (its drop-ins' included, as systemd
# reads them) like run_process, and "stop" stops it like stop_process.
function systemctl {
    _fake_record systemctl "$@"
    local unit=${*: -1}
    local service=${unit%.service}
    case "$1" in
        start | enable)
            if [[ "$1" == enable && "$2" != --now ]]; then
                return 0
            fi
            if [[ ",${FAKE_DEVSTACK_RUN:-}," == *",${service},"* ]]; then
                local command
                command=$(cat "$TRUSTED_SYSTEMD_DIR/$unit" \
                    "$TRUSTED_SYSTEMD_DIR/$unit.d/"*.conf 2>/dev/null \
                    | sed -n 's/^ExecStart=\(..*\)$/\1/p' | tail -1)
                mkdir -p "$FAKE_DEVSTACK_DIR/pids"
                # shellcheck disable=SC2086
                setsid $command > "$FAKE_DEVSTACK_DIR/$service.log" 2>&1 &
                echo $! > "$FAKE_DEVSTACK_DIR/pids/$service"
            fi
            ;;
        stop)
            stop_process "$service"
            ;;
    esac
}
