"""The fuzz targets (``trusted_testing.fuzz_targets``, issue 18): every
seed and every kept crashing input raises only the project's errors, and
a short coverage-guided run of every target (atheris) finds nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import testtools

from trusted_testing.fuzz_targets import TARGETS, run_one

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
REGRESSIONS = os.path.join(ROOT, "tools", "fuzz", "regressions")


class FuzzTargetsTest(testtools.TestCase):
    def test_every_seed_raises_only_project_errors(self) -> None:
        for target in TARGETS.values():
            for seed in target.seeds():
                run_one(target, seed)  # anything else propagates

    def test_kept_crashing_inputs_raise_only_project_errors(self) -> None:
        kept = 0
        for name in sorted(os.listdir(REGRESSIONS)):
            self.assertIn(name, TARGETS, f"regressions/{name}: no such target")
            folder = os.path.join(REGRESSIONS, name)
            for entry in sorted(os.listdir(folder)):
                with open(os.path.join(folder, entry), "rb") as f:
                    data = f.read()
                try:
                    run_one(TARGETS[name], data)
                except Exception as exc:  # noqa: BLE001 -- name the input
                    self.fail(f"regressions/{name}/{entry}: {exc!r}")
                kept += 1
        self.assertGreater(kept, 0)

    def test_targets_cover_the_issue_list(self) -> None:
        wanted = {
            "tpm_attest", "tpm_public", "tpm_signature", "quote_answer",
            "ima_ascii", "ima_binary", "ima_evidence", "event_log", "pcr_policy",
            "runtime_policy", "mb_policy", "sealing_policy", "envelope",
            "signed_event", "capability", "rekey", "wire_message",
            "host_round", "batch_proof", "efi_signature_list", "ipl_string",
            "secure_boot_log", "shim_image",
        }  # fmt: skip
        self.assertLessEqual(wanted, set(TARGETS))

    def test_short_coverage_guided_run_of_every_target_is_clean(self) -> None:
        # One process, the first byte picks the target (tools/fuzz/run.py all).
        runs = 30_000
        proc = subprocess.run(
            [sys.executable, "tools/fuzz/run.py", "all", f"--runs={runs}"],
            capture_output=True,
            cwd=ROOT,
            timeout=600,
        )
        tail = proc.stderr.decode("utf-8", "replace")[-3000:]
        self.assertEqual(0, proc.returncode, tail)
        self.assertIn(f"Done {runs} runs".encode(), proc.stderr, tail)
