"""A test case base with one real swtpm process shared by its class."""

from __future__ import annotations

import os
import shutil
import tempfile

import testtools

from trusted_testing.swtpm import Swtpm, free_port_pair


class SwtpmTestCase(testtools.TestCase):
    """Starts ``cls.swtpm`` (state and local EK CA under ``cls.tmp``) once
    for the class and stops it, removing ``cls.tmp``, afterwards."""

    prefix = "test-swtpm-"
    tmp: str
    ca_dir: str
    swtpm: Swtpm

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix=cls.prefix)
        cls.ca_dir = os.path.join(cls.tmp, "localca")
        cls.swtpm = Swtpm(os.path.join(cls.tmp, "state"), free_port_pair(), cls.ca_dir)
        try:
            cls.swtpm.start()
        except Exception:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.swtpm.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()
