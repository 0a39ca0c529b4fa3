"""Policy language of CP-ABE sealing: strict parsing and attribute encoding."""

import hypothesis
import testtools
from hypothesis import strategies as st

from verifier.protocol.abe import (
    Attribute,
    Gate,
    PolicyError,
    parse_attribute,
    parse_policy,
    satisfies,
)
from verifier.protocol.errors import MalformedError


class ParseTest(testtools.TestCase):
    def test_precedence_and_binds_tighter(self) -> None:
        tree = parse_policy("a or b and c")
        self.assertEqual(
            Gate(1, (Attribute("a"), Gate(2, (Attribute("b"), Attribute("c"))))),
            tree,
        )

    def test_issue_example(self) -> None:
        tree = parse_policy("region=eu and (hv=kvm-9 or hv=xen-4.5)")
        self.assertEqual(
            Gate(
                2,
                (
                    Attribute("region", "eu"),
                    Gate(1, (Attribute("hv", "kvm-9"), Attribute("hv", "xen-4.5"))),
                ),
            ),
            tree,
        )

    def test_threshold(self) -> None:
        tree = parse_policy("2 of (a, b or c, image=sha256:abcd)")
        assert isinstance(tree, Gate)
        self.assertEqual(2, tree.k)
        self.assertEqual(3, len(tree.children))
        self.assertEqual(Attribute("image", "sha256:abcd"), tree.children[2])

    def test_whitespace_is_free(self) -> None:
        self.assertEqual(parse_policy("(a and b)"), parse_policy(" ( a\tand\nb ) "))

    def test_single_attribute(self) -> None:
        self.assertEqual(Attribute("region", "eu-west"), parse_policy("region=eu-west"))

    def test_malformed_policies_report_position(self) -> None:
        cases = {
            "region=eu and": 13,
            "(a or b": 7,
            "2 of (a)": 0,
            "0 of (a,b)": 0,
            "a b": 2,
            "": 0,
            "   ": 3,
            "region=": 7,
            "=eu": 0,
            "a and or b": 6,
            "a and (b or c))": 14,
            "2 (a, b)": 2,
            "2 of a, b": 5,
            "2 of (a, b": 10,
            "and": 0,
            "OR": 0,
            "hv=kvm-9 .2": 9,
            "a and b,": 7,
            "region=eu$": 9,
            "1234 of (a)": 0,
            "a=b=c": 3,
            "ünï": 0,
        }
        for text, pos in cases.items():
            exc = self.assertRaises(PolicyError, parse_policy, text)
            self.assertEqual(pos, exc.position, text)
            self.assertIsInstance(exc, MalformedError)
            self.assertIn(f"position {pos}", str(exc))
            self.assertTrue(exc.expected)

    def test_not_a_string(self) -> None:
        self.assertRaises(PolicyError, parse_policy, b"a and b")

    def test_nesting_and_size_limits(self) -> None:
        self.assertRaises(PolicyError, parse_policy, "(" * 40 + "a" + ")" * 40)
        self.assertRaises(PolicyError, parse_policy, " or ".join(["a"] * 300))

    def test_no_silent_truncation(self) -> None:
        # charm-crypto turns "region=eu" into "REGION"; we keep it verbatim.
        self.assertEqual(Attribute("region", "eu"), parse_policy("region=eu"))
        self.assertNotEqual(parse_policy("Region=eu"), parse_policy("region=eu"))


class AttributeTest(testtools.TestCase):
    def test_round_trip(self) -> None:
        for text in ("hv=kvm-9.2", "region=eu-west", "image=sha256:abcd", "tpm"):
            self.assertEqual(text, parse_attribute(text).text)

    def test_encoding_is_unambiguous(self) -> None:
        encs = {
            Attribute("hv", "kvm-9.2").encode(),
            Attribute("hv", "kvm-9").encode(),
            Attribute("hv=kvm-9", ".2").encode(),  # not parseable, still distinct
            Attribute("hv").encode(),
            Attribute("hvk", "vm-9.2").encode(),
        }
        self.assertEqual(5, len(encs))

    def test_bad_attributes(self) -> None:
        for bad in (
            "",
            "region=",
            "=eu",
            "a b",
            "a\x00",
            "hv=kvm 9",
            "and",
            "of=1",
            "x" * 65,
            "a=" + "v" * 129,
            "région=eu",
        ):
            self.assertRaises(PolicyError, parse_attribute, bad)

    @hypothesis.given(st.text(max_size=12))
    def test_attribute_parse_is_exact_or_raises(self, text: str) -> None:
        try:
            attr = parse_attribute(text)
        except PolicyError:
            return
        self.assertEqual(text, attr.text)


class SatisfiesTest(testtools.TestCase):
    def test_examples(self) -> None:
        policy = "region=eu and (hv=kvm-9 or hv=xen-4.5)"
        self.assertTrue(satisfies(policy, ["region=eu", "hv=xen-4.5"]))
        self.assertFalse(satisfies(policy, ["region=eu", "hv=kvm-9.2"]))
        self.assertFalse(satisfies(policy, ["hv=kvm-9"]))
        self.assertTrue(satisfies("2 of (a, b, c)", ["c", "a"]))
        self.assertFalse(satisfies("2 of (a, b, c)", ["c"]))
