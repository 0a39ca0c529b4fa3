"""Unknown sections and options of a configuration file are named at start
(:mod:`verifier.common.conf_files`, :func:`verifier.common.config.load`)."""

from __future__ import annotations

import os
import textwrap

import fixtures
import testtools
from oslo_config import cfg
from oslo_log import log

from verifier import conf as vconf
from verifier.common import conf_files, config
from verifier.tests.unit.test_install_roles import ROOT


class UnknownSettingsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path

    def write(self, text: str, name: str = "verifier.conf") -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(textwrap.dedent(text).lstrip())
        return path

    def conf(self, *args: str) -> cfg.ConfigOpts:
        conf = cfg.ConfigOpts()
        vconf.register_opts(conf)
        log.register_options(conf)
        conf(list(args), project="trusted-cloud", default_config_files=[])
        return conf

    def found(self, *args: str) -> list[str]:
        return [str(s) for s in conf_files.unknown_settings(self.conf(*args))]

    def test_a_misspelt_option_is_named_with_file_line_and_section(self) -> None:
        path = self.write("""
            [DEFAULT]
            debug = true

            [verifier]
            quote_interval = 2
            qoute_interval = 5
        """)
        [setting] = conf_files.unknown_settings(self.conf("--config-file", path))
        self.assertEqual(
            conf_files.UnknownSetting(path, 6, "verifier", "qoute_interval",
                                      "quote_interval"),
            setting,
        )  # fmt: skip
        self.assertEqual(
            f"{path}:6: [verifier] qoute_interval: unknown option, ignored "
            "(did you mean quote_interval?)",
            str(setting),
        )

    def test_a_misspelt_section_is_named_once(self) -> None:
        path = self.write("""
            [verifer]
            quote_interval = 2
            port = 1
        """)
        self.assertEqual(
            [f"{path}:1: [verifer]: unknown section, ignored (did you mean verifier?)"],
            self.found("--config-file", path),
        )

    def test_a_dashed_option_is_not_the_option(self) -> None:
        # oslo.config reads quote_interval only: quote-interval is ignored
        path = self.write("[verifier]\nquote-interval = 7\n")
        [line] = self.found("--config-file", path)
        self.assertIn("[verifier] quote-interval: unknown option", line)

    def test_a_correct_file_with_library_sections_is_quiet(self) -> None:
        path = self.write("""
            [DEFAULT]
            log_file = /var/log/x.log
            transport_url = rabbit://u:p@h:5672/

            [verifier]
            quote_interval = 2

            [keystone_authtoken]
            auth_type = password
            auth_url = https://keystone.example.org/identity
            username = trusted
            password = secret
            user_domain_name = Default
            project_name = service
            www_authenticate_uri = https://keystone.example.org/identity

            [oslo_policy]
            policy_file = policy.yaml

            [oslo_messaging_notifications]
            driver = messagingv2

            [placement]
            auth_section = service_user
            region_name = RegionOne

            [service_user]
            auth_type = password
            auth_url = https://keystone.example.org/identity
            username = trusted
        """)
        self.assertEqual([], self.found("--config-file", path))

    def test_a_shared_file_with_other_commands_sections_is_quiet(self) -> None:
        path = self.write("""
            [registrar]
            port = 8891
            [agent]
            uuid = 1c6e1a1c-3d1e-4f0e-9d2a-6f3f2b0a9c11
            [revocation_listener]
            webhook_port = 8893
        """)
        self.assertEqual([], self.found("--config-file", path))

    def test_a_keystoneauth_plugin_option_is_checked(self) -> None:
        path = self.write("""
            [keystone_authtoken]
            auth_type = password
            pasword = secret
        """)
        [line] = self.found("--config-file", path)
        self.assertIn(
            ":3: [keystone_authtoken] pasword: unknown option, ignored "
            "(did you mean password?)",
            line,
        )

    def test_a_deprecated_name_is_known(self) -> None:
        path = self.write("[verifier]\nold_interval = 3\n")
        conf = cfg.ConfigOpts()
        conf.register_opt(
            cfg.FloatOpt("new_interval", deprecated_name="old_interval"), "verifier"
        )
        conf(["--config-file", path], default_config_files=[])
        self.assertEqual([], conf_files.unknown_settings(conf))
        self.assertEqual(3.0, conf.verifier.new_interval)

    def test_config_dir_files_are_checked(self) -> None:
        sub = os.path.join(self.dir, "conf.d")
        os.mkdir(sub)
        self.write("[verifier]\nport = 1\n")
        self.write("[verifier]\nprot = 2\n", name="conf.d/10-port.conf")
        found = self.found("--config-dir", sub)
        self.assertEqual(1, len(found), found)
        self.assertIn("10-port.conf:2: [verifier] prot: unknown option", found[0])

    def test_load_prints_one_warning_line_each_on_stderr(self) -> None:
        path = self.write("[verifier]\nqoute_interval = 5\n[verifer]\nport = 1\n")
        err = self.useFixture(fixtures.StringStream("stderr"))
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", err.stream))
        conf = cfg.ConfigOpts()
        vconf.register_opts(conf)
        config.load(conf, ["--config-file", path], "trusted-verifier")
        err.stream.flush()
        lines = err.getDetails()["stderr"].as_text().splitlines()
        self.assertEqual(
            [
                f"trusted-verifier: warning: {path}:2: [verifier] qoute_interval: "
                "unknown option, ignored (did you mean quote_interval?)",
                f"trusted-verifier: warning: {path}:3: [verifer]: unknown section, "
                "ignored (did you mean verifier?)",
            ],
            lines,
        )
        self.assertEqual(2.0, conf.verifier.quote_interval)


class NamespacesTest(testtools.TestCase):
    def test_the_namespaces_are_the_generator_configs(self) -> None:
        etc = os.path.join(ROOT, "etc")
        listed: set[str] = set()
        for name in os.listdir(etc):
            if name.endswith("config-generator.conf"):
                with open(os.path.join(etc, name), encoding="utf-8") as handle:
                    listed |= {
                        line.split("=", 1)[1].strip()
                        for line in handle
                        if line.startswith("namespace")
                    }
        self.assertEqual(listed, set(conf_files.NAMESPACES))
