"""``trusted-certs``: make the operator CA and mTLS certificates.

Example::

    trusted-certs --dir /etc/trusted-cloud/pki registrar verifier tenant agent

writes ``ca.pem``/``ca-key.pem`` (created once) and ``<name>.pem`` /
``<name>-key.pem`` for each name, valid for TLS server and client use.
"""

from __future__ import annotations

import argparse
import os
import sys

from verifier.ca import CaError, CertificateAuthority
from verifier.common import version


def main(argv: list[str] | None = None) -> int:
    version.exit_if_asked(argv, "trusted-certs")
    parser = argparse.ArgumentParser(
        prog="trusted-certs",
        description="Create the operator CA and mTLS certificates.",
    )
    parser.add_argument("--dir", required=True, help="output directory")
    parser.add_argument(
        "--hosts",
        default="127.0.0.1,localhost",
        help="comma-separated IPs/DNS names for the certificates (default %(default)s)",
    )
    parser.add_argument("names", nargs="+", help="certificate names, e.g. verifier")
    args = parser.parse_args(argv)
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    try:
        if os.path.exists(os.path.join(args.dir, "ca-key.pem")):
            ca = CertificateAuthority.load(args.dir)
        else:
            ca = CertificateAuthority.create(args.dir, "Trusted Cloud operator CA")
        for name in args.names:
            if not name or os.sep in name or name.startswith("."):
                raise CaError(f"certificate name {name!r}: not a plain file name")
            ca.issue_to_files(args.dir, name, hosts)
            print(f"wrote {name}.pem and {name}-key.pem in {args.dir}")
    except OSError as exc:
        where = exc.filename or args.dir
        print(
            f"trusted-certs: error: --dir {args.dir}: {where}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    except (CaError, ValueError) as exc:
        print(f"trusted-certs: error: --dir {args.dir}: {exc}", file=sys.stderr)
        return 2
    return 0
