"""The attestation log's tree and proofs (RFC 9162 2.1), cross-checked
against the Certificate Transparency reference vectors and exhaustively
against each other for small trees."""

from __future__ import annotations

import testtools

from verifier.protocol.errors import MalformedError
from verifier.protocol.translog import (
    EMPTY_ROOT,
    Frontier,
    LogProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_from_leaves,
    subtree_root,
    verify_consistency,
    verify_inclusion,
)

# The Certificate Transparency reference leaves and the root of the tree of
# their first n (n = 0..8), as published with RFC 6962's reference code.
CT_LEAVES = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
CT_ROOTS = [
    bytes.fromhex(h)
    for h in (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    )
]
_H = bytes.fromhex
CT_INCLUSION = {
    (0, 8): [
        _H("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
        _H("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
        _H("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
    ],
    (5, 8): [
        _H("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        _H("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
        _H("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
    ],
}
CT_CONSISTENCY = {
    (2, 8): [
        _H("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
        _H("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
    ],
    (6, 8): [
        _H("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
        _H("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
        _H("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
    ],
    (2, 5): [
        _H("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
        _H("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
    ],
}


class Tree:
    """A tree kept as a store would: the nodes Frontier.append returns."""

    def __init__(self, leaves: list[bytes]) -> None:
        self.nodes: dict[tuple[int, int], bytes] = {}
        self.frontier = Frontier()
        self.roots = [self.frontier.root()]
        for data in leaves:
            for level, index, digest in self.frontier.append(leaf_hash(data)):
                assert (level, index) not in self.nodes
                self.nodes[(level, index)] = digest
            self.roots.append(self.frontier.root())
        self.calls = 0

    def get(self, level: int, index: int) -> bytes:
        self.calls += 1
        return self.nodes[(level, index)]


def _flip(proof: list[bytes], k: int) -> list[bytes]:
    bad = list(proof)
    bad[k] = bytes([bad[k][0] ^ 1]) + bad[k][1:]
    return bad


class HashingTest(testtools.TestCase):
    def test_roots_match_the_ct_reference(self) -> None:
        for n, root in enumerate(CT_ROOTS):
            self.assertEqual(root, root_from_leaves(CT_LEAVES[:n]), str(n))
            self.assertEqual(root, Tree(CT_LEAVES[:n]).frontier.root(), str(n))

    def test_empty_tree_root_is_sha256_of_nothing(self) -> None:
        self.assertEqual(CT_ROOTS[0], EMPTY_ROOT)
        self.assertEqual(EMPTY_ROOT, Frontier().root())

    def test_prefixes_keep_leaves_and_nodes_apart(self) -> None:
        a, b = leaf_hash(b"a"), leaf_hash(b"b")
        self.assertNotEqual(node_hash(a, b), leaf_hash(a + b))
        self.assertEqual(root_from_leaves([b"a", b"b"]), node_hash(a, b))

    def test_split_is_the_largest_power_of_two_below_n(self) -> None:
        # 3 leaves: ((0, 1), 2), not the "unpaired node moves up" tree's twin
        h = [leaf_hash(bytes([i])) for i in range(6)]
        data = [bytes([i]) for i in range(6)]
        self.assertEqual(
            node_hash(node_hash(h[0], h[1]), h[2]), root_from_leaves(data[:3])
        )
        six = node_hash(
            node_hash(node_hash(h[0], h[1]), node_hash(h[2], h[3])),
            node_hash(h[4], h[5]),
        )
        self.assertEqual(six, root_from_leaves(data))

    def test_frontier_matches_reference_for_sizes_0_to_70(self) -> None:
        data = [b"leaf %d" % i for i in range(71)]
        tree = Tree(data)
        for n in range(71):
            self.assertEqual(root_from_leaves(data[:n]), tree.roots[n], str(n))

    def test_append_returns_every_completed_node(self) -> None:
        frontier = Frontier()
        done = [frontier.append(leaf_hash(bytes([i]))) for i in range(8)]
        self.assertEqual([(0, 0)], [n[:2] for n in done[0]])
        self.assertEqual([(0, 1), (1, 0)], [n[:2] for n in done[1]])
        self.assertEqual([(0, 6)], [n[:2] for n in done[6]])
        self.assertEqual([(0, 7), (1, 3), (2, 1), (3, 0)], [n[:2] for n in done[7]])
        self.assertEqual(frontier.root(), done[7][-1][2])
        self.assertEqual(1, len(frontier.hashes))

    def test_frontier_round_trips_and_rebuilds_from_the_store(self) -> None:
        tree = Tree([bytes([i]) for i in range(13)])
        again = Frontier.from_dict(tree.frontier.to_dict())
        self.assertEqual(tree.frontier, again)
        self.assertEqual(3, len(again.hashes))  # 13 = 8 + 4 + 1
        for n in range(14):
            self.assertEqual(tree.roots[n], Frontier.at(n, tree.get).root())
        copy = again.copy()
        copy.append(leaf_hash(b"x"))
        self.assertEqual(13, again.size)

    def test_frontier_refuses_hashes_that_do_not_fit_its_size(self) -> None:
        h = leaf_hash(b"x")
        self.assertRaises(MalformedError, Frontier, 3, [h])
        self.assertRaises(MalformedError, Frontier, 1, [b"short"])
        self.assertRaises(MalformedError, Frontier, -1, [])
        self.assertRaises(MalformedError, Frontier, True, [h])
        self.assertRaises(MalformedError, Frontier().append, b"not a hash")
        bad: object
        for bad in (
            None,
            [],
            {"size": 1},
            {"size": 1, "hashes": ["zz"]},
            {"size": 1, "hashes": [h.hex()[:-2]]},
            {"size": "1", "hashes": [h.hex()]},
            {"size": 1, "hashes": h.hex()},
        ):
            self.assertRaises(MalformedError, Frontier.from_dict, bad)

    def test_subtree_root_of_aligned_ranges(self) -> None:
        data = [bytes([i]) for i in range(21)]
        tree = Tree(data)
        for start, end in ((0, 21), (16, 21), (20, 21), (8, 16), (4, 7), (12, 15)):
            self.assertEqual(
                root_from_leaves(data[start:end]), subtree_root(start, end, tree.get)
            )
        self.assertEqual(EMPTY_ROOT, subtree_root(0, 0, tree.get))
        for start, end in ((3, 7), (5, 5), (6, 2), (2, 6), (-1, 3)):
            error = self.assertRaises(LogProofError, subtree_root, start, end, tree.get)
            self.assertEqual("index_out_of_range", error.reason)


class ProofTest(testtools.TestCase):
    def test_ct_reference_inclusion_proofs(self) -> None:
        tree = Tree(CT_LEAVES)
        for (index, size), proof in CT_INCLUSION.items():
            self.assertEqual(proof, inclusion_proof(index, size, tree.get))
            verify_inclusion(
                leaf_hash(CT_LEAVES[index]), index, size, proof, CT_ROOTS[size]
            )

    def test_ct_reference_consistency_proofs(self) -> None:
        tree = Tree(CT_LEAVES)
        for (old, new), proof in CT_CONSISTENCY.items():
            self.assertEqual(proof, consistency_proof(old, new, tree.get))
            verify_consistency(old, new, CT_ROOTS[old], CT_ROOTS[new], proof)

    def test_every_inclusion_proof_up_to_40_verifies_and_no_tampered_one(
        self,
    ) -> None:
        data = [b"entry %d" % i for i in range(40)]
        tree = Tree(data)
        for size in range(1, 41):
            root = tree.roots[size]
            for index in range(size):
                leaf = leaf_hash(data[index])
                proof = inclusion_proof(index, size, tree.get)
                verify_inclusion(leaf, index, size, proof, root)
                for k in range(len(proof)):
                    error = self.assertRaises(
                        LogProofError,
                        verify_inclusion,
                        leaf,
                        index,
                        size,
                        _flip(proof, k),
                        root,
                    )
                    self.assertEqual("root_mismatch", error.reason)
                for bad in [[*proof, root]] + ([proof[:-1]] if proof else []):
                    error = self.assertRaises(
                        LogProofError, verify_inclusion, leaf, index, size, bad, root
                    )
                    self.assertEqual("bad_proof_length", error.reason)
                if index + 1 < size:
                    self.assertRaises(
                        LogProofError,
                        verify_inclusion,
                        leaf,
                        index + 1,
                        size,
                        proof,
                        root,
                    )

    def test_every_consistency_proof_up_to_40_verifies_and_no_tampered_one(
        self,
    ) -> None:
        tree = Tree([b"entry %d" % i for i in range(40)])
        for new in range(41):
            for old in range(new + 1):
                proof = consistency_proof(old, new, tree.get)
                verify_consistency(old, new, tree.roots[old], tree.roots[new], proof)
                for k in range(len(proof)):
                    error = self.assertRaises(
                        LogProofError,
                        verify_consistency,
                        old,
                        new,
                        tree.roots[old],
                        tree.roots[new],
                        _flip(proof, k),
                    )
                    self.assertEqual("bad_proof", error.reason)
                if proof:
                    error = self.assertRaises(
                        LogProofError,
                        verify_consistency,
                        old,
                        new,
                        tree.roots[old],
                        tree.roots[new],
                        proof[:-1],
                    )
                    self.assertEqual("bad_proof_length", error.reason)

    def test_proofs_read_logarithmically_many_nodes(self) -> None:
        tree = Tree([bytes([i % 256, i // 256]) for i in range(1000)])
        for call in (
            lambda: inclusion_proof(0, 1000, tree.get),
            lambda: inclusion_proof(999, 1000, tree.get),
            lambda: inclusion_proof(517, 1000, tree.get),
            lambda: consistency_proof(1, 1000, tree.get),
            lambda: consistency_proof(999, 1000, tree.get),
            lambda: consistency_proof(333, 1000, tree.get),
            lambda: subtree_root(0, 1000, tree.get),
        ):
            tree.calls = 0
            call()
            self.assertLessEqual(tree.calls, 2 * 10 + 2)

    def test_a_store_without_the_node_is_named(self) -> None:
        tree = Tree([bytes([i]) for i in range(6)])
        del tree.nodes[(1, 2)]
        error = self.assertRaises(LogProofError, inclusion_proof, 0, 6, tree.get)
        self.assertEqual("missing_node", error.reason)
        tree.nodes[(1, 2)] = b"short"
        error = self.assertRaises(LogProofError, consistency_proof, 3, 6, tree.get)
        self.assertEqual("bad_node", error.reason)

    def test_out_of_range_arguments_are_named(self) -> None:
        tree = Tree([bytes([i]) for i in range(6)])
        root = tree.roots[6]
        for index, size in ((6, 6), (0, 0), (-1, 6), (7, 6)):
            error = self.assertRaises(
                LogProofError, inclusion_proof, index, size, tree.get
            )
            self.assertEqual("index_out_of_range", error.reason)
            error = self.assertRaises(
                LogProofError, verify_inclusion, root, index, size, [], root
            )
            self.assertEqual("index_out_of_range", error.reason)
        error = self.assertRaises(LogProofError, consistency_proof, 5, 4, tree.get)
        self.assertEqual("index_out_of_range", error.reason)
        error = self.assertRaises(
            LogProofError, verify_consistency, 5, 4, root, root, []
        )
        self.assertEqual("index_out_of_range", error.reason)

    def test_trivial_consistency_proofs_are_empty(self) -> None:
        tree = Tree([bytes([i]) for i in range(6)])
        self.assertEqual([], consistency_proof(0, 6, tree.get))
        self.assertEqual([], consistency_proof(6, 6, tree.get))
        verify_consistency(0, 6, EMPTY_ROOT, tree.roots[6], [])
        verify_consistency(6, 6, tree.roots[6], tree.roots[6], [])
        error = self.assertRaises(
            LogProofError,
            verify_consistency,
            6,
            6,
            tree.roots[6],
            tree.roots[5],
            [],
        )
        self.assertEqual("bad_proof", error.reason)
        error = self.assertRaises(
            LogProofError,
            verify_consistency,
            6,
            6,
            tree.roots[6],
            tree.roots[6],
            [tree.roots[6]],
        )
        self.assertEqual("bad_proof_length", error.reason)

    def test_verifiers_refuse_what_is_not_a_hash(self) -> None:
        root = leaf_hash(b"x")
        for proof in ([b"short"], b"x" * 32, "text", None, [None]):
            self.assertRaises(
                MalformedError,
                verify_inclusion,
                root,
                0,
                2,
                proof,
                root,
            )
            self.assertRaises(
                MalformedError,
                verify_consistency,
                1,
                2,
                root,
                root,
                proof,
            )
        self.assertRaises(MalformedError, verify_inclusion, b"", 0, 1, [], root)
        error = self.assertRaises(
            LogProofError, verify_inclusion, root, 0, 2, [root] * 65, root
        )
        self.assertEqual("bad_proof_length", error.reason)
