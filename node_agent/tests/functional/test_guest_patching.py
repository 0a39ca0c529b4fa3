"""Patching an attested VM: the story in a real guest (issue 28, item 6).

The operator's image boots under qemu (TCG) + OVMF + a swtpm vTPM, as in
:mod:`node_agent.tests.functional.test_guest_story`, and is enrolled
pinned to version 1 of the runtime policy ``web``, built from the image.
The tenant keeps its own apt repository: real Debian packages fetched on
the host with ``apt-get download`` (``jq`` and ``libjq1`` in two versions,
the bookworm one and the newer one of bookworm-security, ``libonig5``,
``tree`` and ``less``, none of them in the image), its ``Release`` signed
with the tenant's key, served on the host's loopback (the guest reaches it
at http://10.0.2.2:PORT through qemu's user network)
(:mod:`trusted_testing.apt_repo`).

As the user guide's "Patching an attested VM" page
(``doc/source/user/patching.rst``) tells a tenant to, with the page's own
``trusted-tenant`` commands (its example repository, keyring, package list
and node replaced by the story's):

1. ``trusted-tenant policy generate runtime --apt-repo URL --keyring KEY
   --packages ... --file SOURCE=tenant.list`` writes the digests of
   everything the packages install and of the tenant's own apt source;
   ``policy add --base web@1`` stores it as version 2, a delta over 1;
2. ``trusted-tenant policy check --file web-2.json --base web@1 --node
   UUID`` (the page checks the file before storing it; the story runs it
   after, on the same content) passes;
3. ``trusted-tenant node set-policy UUID --runtime-policy web`` publishes
   it: the node follows ``web``, its status shows version 2;
4. the guest installs the packages, upgrades ``jq`` and runs the new
   programs: still attested, and the node's only event is the policy
   change;
5. the agent is stopped and started, then the guest reboots: each time
   ``unreachable`` then ``recovered``, and no revocation action runs;
6. the dry run of version 1 (without the delta) lists exactly the
   installed and upgraded files the node has run or read;
7. a program no package installs: revoked naming it, the hooks fire.

One VM boot (and one reboot) for the class; the tests run in order.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import time
import uuid
from typing import Any

from testtools.content import text_content

from trusted_testing.apt_repo import (
    AptRepo,
    AptRepoError,
    Deb,
    fetch,
    refresh_lists,
    versions,
)
from trusted_testing.cluster import _script
from trusted_testing.guest_vm import build
from trusted_testing.guest_vm_case import VmStoryCase
from trusted_testing.guest_vm_story import (
    AWAY_AND_BACK,
    IMA_LIST,
    StoryNode,
    VmCluster,
)
from verifier.protocol.ima import parse_ascii
from verifier.protocol.ima.judge import evaluate
from verifier.protocol.ima.policy import RuntimePolicy

INTERVAL = 3.0
BOOT_TIMEOUT = 600.0
DETECT_TIMEOUT = 240.0
PAYLOAD = b"""#!/bin/sh
echo "payload ran on node $TRUSTED_NODE_UUID"
"""
#: The packages the guest installs (none is in the image).
INSTALLED = ("tree", "less", "libonig5")
#: The packages the guest installs in their older version, then upgrades.
UPGRADED = ("jq", "libjq1")
#: Where the guest keeps the tenant's repository key and its apt source.
KEYRING = "/etc/apt/keyrings/tenant-archive.gpg"
SOURCE = "/etc/apt/sources.list.d/tenant.list"
#: apt in the guest reads only the tenant's source (the image's sources name
#: Debian's mirrors, which a guest on qemu's user network may not reach).
APT = f"apt-get -q -o Dir::Etc::SourceParts=- -o Dir::Etc::SourceList={SOURCE}"
POLICY_CHANGED = "node.policy_changed"
PAGE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    *("..", "..", "..", "doc", "source", "user", "patching.rst"),
)
#: What the page's commands name, replaced by the story's own.
PAGE_REPO = "https://mirror.example.org/tenant"
PAGE_KEYRING = "tenant-archive.gpg"
PAGE_PACKAGES = "jq,libjq1,libonig5,tree,less"
PAGE_NODE = "4a6e1c2f-0b6e-4e5b-9a51-7c1d2e3f4a5b"
PAGE_SOURCE = "/etc/apt/sources.list.d/tenant.list=tenant.list"


def page_commands() -> dict[str, list[str]]:
    """The page's ``$ trusted-tenant ...`` lines (the first of each
    sub-command, keyed by it: ``policy generate``, ``node set-policy``,
    ``status``...), split as the shell does."""
    found: dict[str, list[str]] = {}
    with open(PAGE, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line.startswith("$ trusted-tenant "):
                argv = shlex.split(line[2:])
                words = argv[1:3] if argv[1] in ("policy", "node") else argv[1:2]
                found.setdefault(" ".join(words), argv[1:])
    return found


class TestGuestPatching(VmStoryCase):
    """One VM through a patch: see the module doc."""

    repo: AptRepo
    old: str
    new: str
    debs: list[Deb]
    prefix = "guest-patching-"

    @classmethod
    def start_story(cls) -> None:
        image = build()
        try:
            cls._fetch_debs()
        except AptRepoError:  # stale lists name versions no longer there
            refresh_lists()
            cls._fetch_debs()
        cls.repo = AptRepo(os.path.join(cls.tmp, "repo"))
        cls.cluster = VmCluster(os.path.join(cls.tmp, "cluster"), INTERVAL)
        cls.repo.publish(cls.debs)
        cls.repo.serve()
        cls.cluster.prepare()
        cls.node = StoryNode.boot(
            cls.cluster,
            image,
            str(uuid.uuid4()),
            PAYLOAD,
            allow_reboot=True,
            policy_name="web",
        )
        cls.node.bootstrap(BOOT_TIMEOUT, runtime_ref="web@1")
        cls._configure_apt()

    @classmethod
    def _fetch_debs(cls) -> None:
        # the bookworm version and the newest (bookworm-security's)
        found = versions(UPGRADED[0])
        if len(found) < 2:
            raise AssertionError(f"apt offers one version of jq only: {found}")
        cls.old, cls.new = found[0], found[-1]
        cls.debs = [fetch(p, v) for p in UPGRADED for v in (cls.old, cls.new)]
        cls.debs += [fetch(p, versions(p)[-1]) for p in INSTALLED]

    @classmethod
    def _configure_apt(cls) -> None:
        """The tenant's repository key and source in the guest."""
        agent = cls.node.guest.agent
        with open(cls.repo.keyring, "rb") as handle:
            key = handle.read()
        for path, data in ((KEYRING, key), (SOURCE, cls.source().encode())):
            done = agent.exec(
                ["/bin/sh", "-c", 'mkdir -p "${0%/*}" && cat > "$0"', path], stdin=data
            )
            if done.exit_code:
                raise AssertionError(f"writing {path}: {done.stderr!r}")

    @classmethod
    def source(cls) -> str:
        return cls.repo.source_line(cls.repo.guest_url(), KEYRING)

    @classmethod
    def _stop(cls) -> None:
        repo = getattr(cls, "repo", None)
        if repo is not None:
            repo.close()
        super()._stop()

    # -- helpers --------------------------------------------------------------

    def tenant(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``trusted-tenant argv`` as the tenant runs it."""
        env = dict(os.environ, **self.cluster.tenant_env())
        return subprocess.run(
            [_script("trusted-tenant"), *argv],
            env=env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )

    def page(self, command: str, **replace: str) -> subprocess.CompletedProcess[str]:
        """Run the page's ``trusted-tenant COMMAND ...`` line in the test's
        directory, with each of its words in ``replace`` (keys: the page's
        words) replaced; each must be on the line."""
        argv = page_commands()[command]
        for word in replace:
            self.assertIn(word, argv, f"the page's {command} line changed")
        return self.tenant(*[replace.get(word, word) for word in argv])

    def in_guest(self, script: str, timeout: float = 600.0) -> str:
        """Run ``script`` as root in the guest; its output (must succeed)."""
        done = self.guest.agent.shell(script, timeout=timeout)
        self.assertEqual(
            0, done.exit_code, f"{script}: {done.text}{done.stderr.decode()}"
        )
        return done.text

    def events(self) -> list[str]:
        return self.cluster.event_types(self.node.uuid)

    def runtime_in_force(self) -> dict[str, Any]:
        return dict(self.status()["policies"]["runtime"])

    def wait_quotes(self, more: int) -> dict[str, Any]:
        """The status once ``more`` quotes more were verified (never revoked
        meanwhile)."""
        target = self.status()["quotes_verified"] + more
        deadline = time.monotonic() + DETECT_TIMEOUT
        status = self.status()
        while time.monotonic() < deadline:
            status = self.status()
            self.assertNotIn(status["state"], ("revoked", "failed"), status)
            if status["state"] == "attested" and status["quotes_verified"] >= target:
                return status
            time.sleep(1.0)
        self.fail(f"not attested by {more} quotes more: {status}")

    def assert_away_and_back(self, quotes: int, since: tuple[int, int]) -> None:
        """Attested again by two quotes more; in between unreachable then
        recovered, signed events whose only hook is the log."""
        deadline = time.monotonic() + BOOT_TIMEOUT
        status, seen = self.status(), set()
        while time.monotonic() < deadline:
            status = self.status()
            seen.add(status["state"])
            self.assertNotEqual("revoked", status["state"], status)
            if (
                status["state"] == "attested"
                and status["quotes_verified"] >= quotes + 2
            ):
                break
            time.sleep(1.0)
        else:
            self.fail(f"not attested again: {status}")
        self.assertIn("unreachable", seen)
        uuid_ = self.node.uuid
        self.assertEqual(AWAY_AND_BACK, self.events()[since[0] :])
        hooks = self.cluster.hook_types(uuid_)[since[1] :]
        self.assertEqual(sorted(AWAY_AND_BACK), sorted(hooks))
        self.assertEqual([], self.cluster.wait_hooks(uuid_, 0.0))

    def run_programs(self) -> None:
        """The packages' programs, each run as root in the guest."""
        out = self.in_guest("echo '{\"patched\": true}' | jq -c .patched")
        self.assertEqual("true\n", out)
        self.assertIn("tree v", self.in_guest("tree --version"))
        self.assertIn("less ", self.in_guest("less --version"))

    # -- the story ------------------------------------------------------------

    def test_1_attested_pinned_to_version_1_of_the_image_policy(self) -> None:
        status = self.status()
        self.assertEqual("attested", status["state"], status)
        runtime = self.runtime_in_force()
        self.assertEqual(("web", 1, False), (
            runtime["name"], runtime["version"], runtime["follows"]
        ))  # fmt: skip
        # none of the packages is installed in the image
        listed = self.guest.agent.exec(
            ["/usr/bin/dpkg-query", "-f", "${Package} ${Status}\n", "-W",
             *UPGRADED, *INSTALLED]
        )  # fmt: skip
        self.assertNotIn(" installed\n", listed.stdout.decode())

    def test_2_tenant_generates_a_delta_from_its_signed_repository(self) -> None:
        # the VM gets the older jq first, then upgrades: both versions
        wanted = [f"{p}={v}" for p in UPGRADED for v in (self.old, self.new)]
        # the tenant's copy of the source line it gave the guest
        with open(os.path.join(self.tmp, "tenant.list"), "w", encoding="utf-8") as out:
            out.write(self.source())
        done = self.page(
            "policy generate",
            **{
                PAGE_REPO: self.repo.url,
                PAGE_KEYRING: self.repo.keyring,
                PAGE_PACKAGES: ",".join([*wanted, *INSTALLED]),
                PAGE_SOURCE: f"{SOURCE}=tenant.list",
            },
        )
        self.assertEqual(0, done.returncode, done.stderr)
        out = os.path.join(self.tmp, "web-2.json")
        with open(out, encoding="utf-8") as handle:
            document = json.load(handle)
        self.assertEqual(("web", 2), (document["name"], document["version"]))
        self.assertNotIn("base", document)
        digests = document["digests"]
        for deb in self.debs:
            for path, digest in deb.files().items():
                self.assertIn(f"sha256:{digest}", digests.get(path, []), path)
        # what the tenant wrote itself: its apt source (the key is read by
        # apt's unprivileged _apt user, not measured)
        source = hashlib.sha256(self.source().encode()).hexdigest()
        self.assertEqual([f"sha256:{source}"], digests[SOURCE])
        done = self.page("policy add")
        self.assertEqual(0, done.returncode, done.stderr)
        shown = self.tenant("policy", "show", "web@2")
        self.assertEqual(0, shown.returncode, shown.stderr)
        self.assertEqual(2, json.loads(shown.stdout)["version"])
        # pinned: the node did not move
        self.assertEqual(1, self.runtime_in_force()["version"])

    def test_3_dry_run_of_version_2_passes_on_the_node(self) -> None:
        done = self.page("policy check", **{PAGE_NODE: self.node.uuid})
        self.assertEqual(0, done.returncode, done.stdout + done.stderr)
        self.assertIn("PASS", done.stdout)
        self.assertEqual([], self.events())

    def test_4_publishing_makes_the_node_follow_web_and_shows_version_2(
        self,
    ) -> None:
        done = self.page("node set-policy", **{PAGE_NODE: self.node.uuid})
        self.assertEqual(0, done.returncode, done.stderr)
        runtime = self.runtime_in_force()
        self.assertEqual(("web", 2, True), (
            runtime["name"], runtime["version"], runtime["follows"]
        ))  # fmt: skip
        shown = self.page("status", **{PAGE_NODE: self.node.uuid})
        self.assertEqual(0, shown.returncode, shown.stderr)
        self.assertIn("runtime policy: web@2 (follows web)", shown.stdout)
        self.assertEqual([POLICY_CHANGED], self.events())
        told = self.page("events", **{PAGE_NODE: self.node.uuid})
        self.assertEqual(0, told.returncode, told.stderr)
        # time, node, kind, "reason: detail (delivered: ...)" (user/events.rst)
        (line,) = told.stdout.splitlines()
        self.assertEqual(
            [self.node.uuid, "policy_changed", "set:"], line.split()[1:4], line
        )
        self.assertIn("set: runtime web@1 -> web@2 (delivered:", line)
        self.assertEqual([], self.cluster.hook_records())

    def test_5_install_and_upgrade_then_run_them_and_stay_attested(self) -> None:
        self.in_guest(f"{APT} update")
        pinned = " ".join(f"{p}={self.old}" for p in UPGRADED)
        self.in_guest(
            f"DEBIAN_FRONTEND=noninteractive {APT} install -y {pinned} "
            + " ".join(INSTALLED)
        )
        self.run_programs()
        self.in_guest(f"DEBIAN_FRONTEND=noninteractive {APT} upgrade -y")
        installed = self.in_guest("dpkg-query -W -f '${Package}=${Version}\\n' jq")
        self.assertEqual(f"jq={self.new}\n", installed)
        self.run_programs()
        status = self.wait_quotes(2)
        self.assertTrue(status["trusted"], status)
        self.assertEqual([POLICY_CHANGED], self.events())
        self.assertEqual([], self.cluster.hook_records())

    def test_6_agent_restart_is_unreachable_then_recovered(self) -> None:
        quotes, since = self.status()["quotes_verified"], self.history()
        self.in_guest("systemctl stop trusted-agent")
        away = self.cluster.wait_node(self.node.uuid, ("unreachable",), DETECT_TIMEOUT)
        self.assertFalse(away["trusted"], away)
        self.in_guest("systemctl start trusted-agent")
        self.assert_away_and_back(quotes, since)

    def test_7_guest_reboot_is_unreachable_then_recovered(self) -> None:
        quotes, since = self.status()["quotes_verified"], self.history()
        self.reboot_guest()
        self.assert_away_and_back(quotes, since)
        # the new boot runs the patched programs too
        self.run_programs()
        self.wait_quotes(1)
        self.assertEqual(
            [POLICY_CHANGED, *AWAY_AND_BACK, *AWAY_AND_BACK], self.events()
        )
        # as the tenant reads them
        told = self.page("events", **{PAGE_NODE: self.node.uuid})
        self.assertEqual(0, told.returncode, told.stderr)
        # newest first: time, node, kind, "reason: detail" (user/events.rst)
        rows = [line.split()[1:4] for line in told.stdout.splitlines()]
        self.assertEqual(
            [
                *[[self.node.uuid, k, f"{k}:"] for k in ("recovered", "unreachable")]
                * 2,
                [self.node.uuid, "policy_changed", "set:"],
            ],
            rows,
        )

    def test_8_dry_run_of_version_1_lists_exactly_the_patched_files(self) -> None:
        done = self.tenant(
            "--json", "policy", "check", "web@1", "--node", self.node.uuid
        )
        self.assertEqual(1, done.returncode, done.stdout + done.stderr)
        self.addDetail("dry run of web@1", text_content(done.stdout))
        (result,) = json.loads(done.stdout)["results"]
        self.assertEqual("fail", result["result"], result)
        failed = {(f["path"], f["detail"].split()[0]) for f in result["failures"]}
        # the entries of the node's list (as far as the check's quote
        # covered it) that version 1 refuses...
        entries = parse_ascii(self.guest.agent.read_file(IMA_LIST))
        judged = entries[: result["entries"]]
        version_1 = RuntimePolicy.from_dict(self.node.runtime_policy)
        refused = {
            (f.path, f.detail.split()[0]) for f in evaluate(version_1, judged[1:], 1)
        }
        self.assertEqual(refused, failed)
        # ...are exactly what the delta added: the packages' files, and
        # what its named rules admit of what apt and dpkg rewrote
        package_files: dict[str, set[str]] = {}
        for deb in self.debs:
            for path, digest in deb.files().items():
                package_files.setdefault(path, set()).add(f"sha256:{digest}")
        shown = self.tenant("policy", "show", "web@2")
        rules = [re.compile(e) for e in json.loads(shown.stdout)["policy"]["excludes"]]
        for path, digest in failed:
            self.assertTrue(
                digest in package_files.get(path, ())
                or any(rule.match(path) for rule in rules),
                f"{path} {digest} is not the delta's",
            )
        paths = {path for path, _ in failed}
        for program in ("/usr/bin/jq", "/usr/bin/tree", "/usr/bin/less"):
            self.assertIn(program, paths)
        # the upgraded library: the node runs the new version's, not the old
        new, old = (
            next(d for d in self.debs if (d.package, d.version) == key).files()
            for key in (("libjq1", self.new), ("libjq1", self.old))
        )
        (library,) = [p for p in paths if p in new and "/libjq.so." in p]
        digests = {d for p, d in failed if p == library}
        self.assertEqual({f"sha256:{new[library]}"}, digests)
        self.assertNotEqual(old[library], new[library])
        # and the dry run changed nothing
        self.assertEqual("attested", self.status()["state"])

    def test_9_a_program_no_package_installs_is_revoked_naming_it(self) -> None:
        program = f"/usr/local/bin/unpackaged-{uuid.uuid4().hex[:8]}"
        ran = self.guest.agent.shell(
            f"printf '#!/bin/sh\\necho no package has me\\n' > {program}; "
            f"chmod 0755 {program}; {program}"
        )
        self.assertEqual((0, "no package has me\n"), (ran.exit_code, ran.text))
        revoked = self.cluster.wait_node(self.node.uuid, ("revoked",), DETECT_TIMEOUT)
        self.assertIn(program, revoked["failure_reason"])
        hooks = self.cluster.wait_hooks(self.node.uuid, 60.0)
        self.assertEqual(["node.revoked"], [r["type"] for r in hooks])
        self.assertEqual("node.revoked", self.events()[-1])
