"""``trusted-agent`` start-up and registration retries: one clear line per
problem, exit status 2 for configuration, retries where they help."""

import asyncio
import logging
import os
import tempfile
import uuid as uuid_mod

import fixtures
import testtools

from node_agent import cmd
from node_agent.exceptions import BootstrapError, RegistrationError, TpmError
from node_agent.tcti import TSS2_LOG_QUIET, quiet_tss_log
from verifier.common.errors import TctiConfigError


class _FlakyAgent:
    """Fails registration with the given errors, then succeeds."""

    def __init__(self, errors):
        self.uuid = str(uuid_mod.uuid4())
        self.errors = list(errors)
        self.attempts = 0

    async def register(self):
        self.attempts += 1
        if self.errors:
            raise self.errors.pop(0)


class RegisterWithRetryTest(testtools.TestCase):
    def setUp(self):
        super().setUp()
        self.logs = self.useFixture(fixtures.FakeLogger(name="node_agent.cmd"))
        self.now = 0.0
        self.sleeps = []

    async def _sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds

    def retry(self, agent, hint=lambda: ""):
        asyncio.run(
            cmd.register_with_retry(
                agent, sleep=self._sleep, clock=lambda: self.now, hint=hint
            )
        )

    def warnings(self):
        return [line for line in self.logs.output.splitlines() if "failed" in line]

    def test_unreachable_registrar_is_retried_with_capped_backoff(self):
        down = RegistrationError("registrar unreachable", retryable=True)
        agent = _FlakyAgent([down] * 12)
        self.retry(agent)
        self.assertEqual(13, agent.attempts)
        self.assertEqual([1, 2, 4, 8, 16, 32] + [60] * 6, self.sleeps)
        self.assertEqual(max(self.sleeps), cmd.BACKOFF_MAX)

    def test_every_attempt_is_logged_with_its_cause_and_the_next_one(self):
        # issue 33: the registrar down was logged once, then nothing for
        # 10 minutes
        down = RegistrationError("registrar unreachable", retryable=True)
        agent = _FlakyAgent([down] * 30)
        self.retry(agent)
        lines = self.warnings()
        self.assertEqual(30, len(lines), self.logs.output)
        for attempt, (line, delay) in enumerate(
            zip(lines, self.sleeps, strict=True), 1
        ):
            self.assertIn(f"(attempt {attempt}, ", line)
            self.assertIn("registrar unreachable", line)
            self.assertIn(f"next attempt in {delay:.0f} s", line)
        self.assertIn(f"failing for {sum(self.sleeps[:-1]):.0f} s", lines[-1])
        self.assertIn("succeeded at attempt 31", self.logs.output)

    def test_tcti_that_cannot_be_loaded_is_not_retried(self):
        agent = _FlakyAgent([TctiConfigError("TCTI 'swtmp:' cannot be loaded")])
        error = self.assertRaises(BootstrapError, self.retry, agent)
        self.assertIn("TCTI 'swtmp:' cannot be loaded", str(error))
        self.assertEqual([], self.sleeps)

    def test_each_new_reason_is_logged(self):
        errors = [
            RegistrationError("registrar unreachable", retryable=True),
            RegistrationError("registrar answered 403: ek_certificate_required"),
            TpmError("tpm2 failure"),
        ]
        self.retry(_FlakyAgent(errors), hint=lambda: "no TPM device /dev/tpmrm0")
        lines = self.warnings()
        self.assertEqual(3, len(lines))
        self.assertIn("ek_certificate_required", lines[1])
        self.assertIn("TPM error: no TPM device /dev/tpmrm0", lines[2])

    def test_configuration_error_is_not_retried(self):
        agent = _FlakyAgent([BootstrapError("[agent] registrar_url is not set")])
        self.assertRaises(BootstrapError, self.retry, agent)
        self.assertEqual([], self.sleeps)

    def test_tpm_hint_names_a_missing_device(self):
        self.assertIn(
            "no TPM device /nonexistent/tpm", cmd.tpm_hint("device:/nonexistent/tpm")
        )
        self.assertEqual("", cmd.tpm_hint("swtpm:host=127.0.0.1,port=1"))

    def test_tss_log_is_off_unless_the_user_set_it(self):
        environ = {}
        quiet_tss_log(environ)
        self.assertEqual(TSS2_LOG_QUIET, environ["TSS2_LOG"])
        environ = {"TSS2_LOG": "all+debug"}
        quiet_tss_log(environ)
        self.assertEqual("all+debug", environ["TSS2_LOG"])


class MainTest(testtools.TestCase):
    """``main()`` as systemd runs it: configuration errors exit with 2 and
    one log line, never a traceback."""

    def setUp(self):
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        self.log = os.path.join(self.dir, "agent.log")
        # oslo.log's setup replaces the root handlers: put them back
        root = logging.getLogger()
        saved, level = list(root.handlers), root.level

        def restore():
            for handler in root.handlers:
                if handler not in saved:
                    handler.close()
            root.handlers[:] = saved
            root.setLevel(level)

        self.addCleanup(restore)

    def run_main(self, **options):
        conf = os.path.join(self.dir, "agent.conf")
        agent = {
            "uuid": str(uuid_mod.uuid4()),
            "tcti": "swtpm:host=127.0.0.1,port=1",
            "work_dir": os.path.join(self.dir, "work"),
            "bootstrap_file": os.path.join(self.dir, "bootstrap.json"),
            "user_data_file": "",
            "instance_data_file": "",
            "instance_id_file": "",
        }
        agent.update(options)
        with open(conf, "w") as f:
            f.write(f"[DEFAULT]\nlog_file = {self.log}\nuse_stderr = false\n")
            f.write("[agent]\n")
            for key, value in agent.items():
                if value is not None:
                    f.write(f"{key} = {value}\n")
        code = cmd.main(["--config-file", conf])
        with open(self.log) as f:
            return code, f.read()

    def test_no_bootstrap_file_and_no_registrar_exits_2_with_one_line(self):
        code, text = self.run_main()
        self.assertEqual(2, code)
        self.assertIn("configuration error: no registrar", text)
        self.assertIn("bootstrap.json does not exist", text)
        self.assertNotIn("Traceback", text)

    def test_malformed_bootstrap_file_exits_2_naming_it(self):
        with open(os.path.join(self.dir, "bootstrap.json"), "w") as f:
            f.write('{"version": 1, "boot_id": ')
        code, text = self.run_main()
        self.assertEqual(2, code)
        self.assertIn("bootstrap.json: malformed bootstrap configuration", text)
        self.assertNotIn("Traceback", text)

    def test_instance_id_that_is_not_a_uuid_exits_2(self):
        path = os.path.join(self.dir, "instance-id")
        with open(path, "w") as f:
            f.write("i-0abc\n")
        code, text = self.run_main(uuid=None, instance_id_file=path)
        self.assertEqual(2, code)
        self.assertIn("is not a UUID", text)

    def test_trial_mode_with_a_hardware_tpm_exits_2_before_registering(self):
        code, text = self.run_main(
            registrar_url="https://127.0.0.1:1",
            tcti="device:/dev/tpmrm0",
            trial_dir=self.dir,
        )
        self.assertEqual(2, code)
        self.assertIn("trial_dir is for a software TPM", text)
        self.assertNotIn("registered", text)
        self.assertNotIn("Traceback", text)

    def test_push_mode_without_push_url_exits_2(self):
        code, text = self.run_main(
            registrar_url="https://127.0.0.1:1", attestation_mode="push"
        )
        self.assertEqual(2, code)
        self.assertIn("attestation_mode = push needs push_url", text)
        self.assertNotIn("Traceback", text)

    def test_unknown_attestation_mode_exits_2(self):
        stderr = self.useFixture(fixtures.StringStream("stderr"))
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", stderr.stream))
        conf = os.path.join(self.dir, "agent.conf")
        with open(conf, "w") as f:
            f.write("[agent]\nattestation_mode = sideways\n")
        self.assertEqual(2, cmd.main(["--config-file", conf]))
        stderr.stream.flush()
        text = stderr.getDetails()["stderr"].as_text()
        self.assertIn("attestation_mode", text)
        self.assertNotIn("Traceback", text)

    def test_tcti_module_typo_exits_2_naming_it(self):
        code, text = self.run_main(
            tcti="swtmp:host=127.0.0.1,port=2321", registrar_url="https://127.0.0.1:1"
        )
        self.assertEqual(2, code)
        self.assertIn("no TCTI module 'swtmp' can be loaded", text)
        self.assertNotIn("Traceback", text)

    def test_missing_config_dir_exits_2(self):
        stderr = self.useFixture(fixtures.StringStream("stderr"))
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", stderr.stream))
        code = cmd.main(["--config-dir", os.path.join(self.dir, "absent.d")])
        self.assertEqual(2, code)
        stderr.stream.flush()
        self.assertIn("configuration error", stderr.getDetails()["stderr"].as_text())
