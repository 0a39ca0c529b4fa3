"""``trusted-vtpm-manager``: companion vTPMs on a compute host.

Examples::

    trusted-vtpm-manager ensure instance-0000002a --instance-uuid UUID
    trusted-vtpm-manager undefine instance-0000002a
    trusted-vtpm-manager forget --instance-uuid UUID
    trusted-vtpm-manager hook DOMAIN prepare begin - < domain.xml
    trusted-vtpm-manager enrol-host [--host compute-1]
    trusted-vtpm-manager unenrol-host [--host compute-1]

Options come from ``--config-file`` (group ``[vtpm_manager]``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys

from oslo_config import cfg

from verifier.common import config, version
from verifier.common import tls as tlsutil
from vtpm_manager import conf as vtpm_conf
from vtpm_manager.exceptions import VtpmError
from vtpm_manager.manager import ManagerConfig
from vtpm_manager.registrar_client import ProviderRegistrarClient

LOG = logging.getLogger("trusted-vtpm-manager")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trusted-vtpm-manager",
        description="Give libvirt domains companion TPM 2.0 vTPMs (Nova's "
        "form) and register their EKs with the registrar under the instance "
        "UUID before the guest boots.",
    )
    parser.add_argument(
        "--config-file",
        action="append",
        default=[],
        help="oslo.config file with a [vtpm_manager] section (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON results")
    sub = parser.add_subparsers(dest="command", required=True)
    ensure = sub.add_parser(
        "ensure",
        help="add the TPM 2.0 device if missing (a running domain gets it at "
        "its next cold boot), make the swtpm state, register the EK",
    )
    ensure.add_argument("domain", help="libvirt domain name or UUID")
    ensure.add_argument(
        "--instance-uuid", help="Nova instance UUID (default: the domain UUID)"
    )
    ensure.add_argument("--model", choices=["tpm-crb", "tpm-tis"])
    ensure.add_argument(
        "--secret-uuid", help="libvirt secret encrypting a new device's state"
    )
    undefine = sub.add_parser(
        "undefine", help="deregister the instance, then undefine the domain"
    )
    undefine.add_argument("domain")
    undefine.add_argument("--instance-uuid")
    _state_flags(undefine)
    forget = sub.add_parser(
        "forget", help="deregister an instance whose domain is already gone"
    )
    forget.add_argument("--instance-uuid", required=True)
    forget.add_argument(
        "--domain-uuid", help="domain UUID of the state (default: instance UUID)"
    )
    _state_flags(forget)
    enrol = sub.add_parser(
        "enrol-host",
        help="enrol this compute host's swtpm local CA (the one libvirt's "
        "swtpm_setup signs Nova's vTPM EK certificates with) with the "
        "registrar under the host's Nova name",
    )
    enrol.add_argument(
        "--host",
        help="Nova's [DEFAULT]/host of this host (default: [vtpm_manager]/host)",
    )
    enrol.add_argument(
        "--localca-conf",
        help="swtpm_localca configuration naming the CA (default: "
        "[vtpm_manager]/localca_conf, /etc/swtpm-localca.conf)",
    )
    enrol.add_argument(
        "--ca-file", help="enrol this PEM CA instead of reading --localca-conf"
    )
    unenrol = sub.add_parser(
        "unenrol-host", help="remove this compute host's CA from the registrar"
    )
    unenrol.add_argument("--host")
    hook = sub.add_parser("hook", help="libvirt qemu hook entry (domain XML on stdin)")
    hook.add_argument("hook_args", nargs="+", help="DOMAIN OPERATION SUBOP EXTRA")
    return parser


def _state_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--keep-state", dest="keep", action="store_true", default=None)
    group.add_argument("--delete-state", dest="keep", action="store_false")


def _load(files: list[str]) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    vtpm_conf.register_opts(conf)
    args: list[str] = []
    for f in files:
        args += ["--config-file", f]
    # one line and exit 2 on a configuration error
    config.load(conf, args, "trusted-vtpm-manager", default_config_files=[])
    return conf


def _manager_config(group: cfg.ConfigOpts.GroupAttr) -> ManagerConfig:
    return ManagerConfig(
        swtpm_storage_dir=group.swtpm_storage_dir,
        localca_dir=group.localca_dir,
        ek_alg=group.ek_alg,
        default_model=group.default_model,
        keep_state=group.keep_state,
        host=group.host,
    )


def _registrar(group: cfg.ConfigOpts.GroupAttr) -> ProviderRegistrarClient:
    ctx = None
    if group.registrar_url.startswith("https:"):
        if not (group.cert_file and group.key_file and group.ca_file):
            raise VtpmError(
                "[vtpm_manager] cert_file, key_file and ca_file are needed for "
                "an https registrar_url"
            )
        try:
            ctx = tlsutil.client_context(group.cert_file, group.key_file, group.ca_file)
        except OSError as exc:
            raise VtpmError(f"cannot load the provider certificate: {exc}")
    return ProviderRegistrarClient(
        group.registrar_url,
        ctx,
        retries=group.registrar_retries,
        backoff=group.registrar_backoff,
    )


Result = dict[str, object]


def _summary(data: Result) -> str:
    return " ".join(f"{k}={v}" for k, v in data.items())


def _run(
    args: argparse.Namespace, group: cfg.ConfigOpts.GroupAttr
) -> tuple[str, Result]:
    config = _manager_config(group)
    registrar = _registrar(group)
    if args.command in ("enrol-host", "unenrol-host"):
        done = _host_ca(args, group, registrar)
        return _summary(done), done
    if args.command == "hook":
        done = _hook(args.hook_args, config, registrar, group.hook_fail_closed)
        return _summary(done), done
    import libvirt

    from vtpm_manager.manager import VtpmManager

    try:
        conn = libvirt.open(group.libvirt_uri)
    except libvirt.libvirtError as exc:
        raise VtpmError(f"cannot connect to {group.libvirt_uri}: {exc}")
    try:
        manager = VtpmManager(conn, registrar, config)
        if args.command == "ensure":
            result = manager.ensure(
                args.domain, args.instance_uuid, args.model, args.secret_uuid
            )
            return result.summary(), dataclasses.asdict(result)
        if args.command == "undefine":
            known = manager.undefine(args.domain, args.instance_uuid, args.keep)
            data: Result = {
                "domain": args.domain,
                "undefined": True,
                "was_registered": known,
            }
        else:
            known = manager.forget(
                args.instance_uuid, args.domain_uuid or args.instance_uuid, args.keep
            )
            data = {"instance_uuid": args.instance_uuid, "was_registered": known}
        return _summary(data), data
    finally:
        conn.close()


def _host_ca(
    args: argparse.Namespace,
    group: cfg.ConfigOpts.GroupAttr,
    registrar: ProviderRegistrarClient,
) -> Result:
    from verifier.protocol.errors import MalformedError
    from verifier.protocol.messages.provider import check_host_name
    from vtpm_manager.host_ca import read_host_ca

    host = args.host or group.host
    try:
        check_host_name("--host", "host", host)
    except MalformedError as exc:
        raise VtpmError(f"bad host name {host!r}: {exc.detail}")
    if args.command == "unenrol-host":
        return {"host": host, "was_enrolled": registrar.unenrol_host(host)}
    if args.ca_file:
        source = args.ca_file
        pem = _read_ca_file(source)
    else:
        source = args.localca_conf or group.localca_conf
        pem = read_host_ca(source)
    created = registrar.enrol_host(host, pem)
    return {"host": host, "ca_from": source, "enrolled": True, "created": created}


def _read_ca_file(path: str) -> str:
    from verifier.protocol.ekcert import MAX_HOST_CA_PEM, load_host_ca
    from verifier.protocol.errors import MalformedError

    try:
        with open(path, "rb") as f:
            pem = f.read(MAX_HOST_CA_PEM + 1)
        load_host_ca(pem)
        return pem.decode("ascii")
    except OSError as exc:
        raise VtpmError(f"cannot read {path}: {exc.strerror or exc}")
    except (MalformedError, UnicodeError) as exc:
        raise VtpmError(f"{path}: {exc}")


def _hook(
    hook_args: list[str],
    config: ManagerConfig,
    registrar: ProviderRegistrarClient,
    fail_closed: bool,
) -> Result:
    from vtpm_manager.hook import on_prepare

    if len(hook_args) < 3:
        raise VtpmError("hook needs DOMAIN OPERATION SUBOP [EXTRA]")
    domain, operation, subop = hook_args[:3]
    if (operation, subop) != ("prepare", "begin"):
        return {"domain": domain, "operation": operation, "action": "none"}
    xml = sys.stdin.read()
    try:
        done = on_prepare(xml, config, registrar)
    except VtpmError as exc:
        if fail_closed:
            raise
        LOG.warning("%s: vTPM not registered (hook_fail_closed=False): %s", domain, exc)
        done = None
    return {"domain": domain, "operation": operation, "action": done or "none"}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``trusted-vtpm-manager``."""
    version.exit_if_asked(argv, "trusted-vtpm-manager")
    import libvirt

    # libvirt prints every error to stderr by default; ours say it better.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    logging.basicConfig(
        level=logging.INFO, format="%(name)s: %(levelname)s: %(message)s"
    )
    args = _parser().parse_args(argv)
    try:
        group = _load(args.config_file).vtpm_manager
        summary, data = _run(args, group)
    except (VtpmError, cfg.Error, ValueError) as exc:
        print(f"trusted-vtpm-manager: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(data, sort_keys=True) if args.json else summary)
    return 0
