"""A test class that takes one real guest through a story: the VM and its
services are started once for the class (:meth:`VmStoryCase.start_story`,
which a class writes) and stopped after its last test, whatever happened."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import testtools

from trusted_testing.guest_vm_boot import VmGuest
from trusted_testing.guest_vm_story import StoryNode, VmCluster

__all__ = ["VmStoryCase"]


class VmStoryCase(testtools.TestCase):
    """One VM (:attr:`node`) and its services (:attr:`cluster`) for the
    class, in a temporary directory (:attr:`tmp`); the tests run in order."""

    cluster: VmCluster
    node: StoryNode
    tmp: str
    #: the temporary directory's prefix
    prefix = "guest-story-"

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix=cls.prefix)
        try:
            cls.start_story()
        except BaseException:
            cls._stop()
            raise

    @classmethod
    def start_story(cls) -> None:
        """Make :attr:`cluster` and :attr:`node` and take the node as far
        as the class's first test expects."""
        raise NotImplementedError

    @classmethod
    def tearDownClass(cls) -> None:
        cls._stop()
        super().tearDownClass()

    @classmethod
    def _stop(cls) -> None:
        """Stop the VM and the services, remove the directory."""
        node = getattr(cls, "node", None)
        if node is not None:
            node.guest.stop()
        cluster = getattr(cls, "cluster", None)
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @property
    def guest(self) -> VmGuest:
        return self.node.guest

    def status(self) -> dict[str, Any]:
        """The verifier's status of the node."""
        found = self.cluster.node_status(self.node.uuid)
        assert found is not None
        return dict(found)
