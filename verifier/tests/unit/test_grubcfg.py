"""What GRUB would boot, read from its configuration (grubscript parses,
grubcfg runs): Debian's generated files, quoting, variables, conditions,
and a named refusal for each construct the reader does not decide."""

from __future__ import annotations

from collections.abc import Mapping

import testtools

from trusted_testing.bootimage import ROOT_UUID, debian_esp_cfg, debian_grub_cfg
from verifier.common.diskimage import DiskImageError, MissingFileError
from verifier.common.grubcfg import GrubMenu, grub_menu, loader_cmdline
from verifier.common.grubscript import parse

_ESP, _ROOT = "hd0,gpt1", "hd0,gpt2"
_VERSION = "6.1.0-18-amd64"


class _Disk:
    """Two file systems held as dicts (the readers have their own tests on
    real images; this is GRUB's logic alone)."""

    def __init__(self, esp: Mapping[str, str], root: Mapping[str, str]) -> None:
        self.files = {
            _ESP: {k: v.encode() for k, v in esp.items()},
            _ROOT: {k: v.encode() for k, v in root.items()},
        }

    def read(self, device: str, path: str) -> bytes:
        try:
            return self.files[device][path]
        except KeyError:
            raise MissingFileError(f"({device}){path}") from None

    def exists(self, device: str, path: str) -> bool:
        return path in self.files.get(device, {})

    def search(self, kind: str, key: str) -> str | None:
        if kind == "fs_uuid" and key == ROOT_UUID:
            return _ROOT
        if kind == "fs_label" and key == "root":
            return _ROOT
        if kind == "file":
            return next((d for d, f in self.files.items() if key in f), None)
        return None


def _menu(root_cfg: str, esp_cfg: str | None = None, **root: str) -> GrubMenu:
    disk = _Disk(
        {"/EFI/debian/grub.cfg": esp_cfg or debian_esp_cfg()},
        {"/boot/grub/grub.cfg": root_cfg, **root},
    )
    return grub_menu(disk, _ESP, "/EFI/debian/grub.cfg", f"({_ESP})/EFI/debian")


def _entry(body: str) -> str:
    return f"menuentry 'Test' {{\n{body}\n}}\n"


class TestDebianConfiguration(testtools.TestCase):
    def test_debian_generated_configuration(self) -> None:
        menu = _menu(debian_grub_cfg(_VERSION), **{"/boot/grub/grubenv": "# GRUB\n"})
        kernel = f"/boot/vmlinuz-{_VERSION}"
        self.assertEqual(
            [
                f"{kernel} root=UUID={ROOT_UUID} ro console=ttyS0 quiet",
                f"{kernel} root=UUID={ROOT_UUID} ro single console=ttyS0",
            ],
            [e.cmdline for e in menu.entries],
        )
        self.assertEqual((_ROOT, kernel), menu.entries[0].kernel)
        self.assertEqual(
            ((_ROOT, f"/boot/initrd.img-{_VERSION}"),), menu.entries[1].initrds
        )
        self.assertEqual(("UEFI Firmware Settings",), menu.skipped)


class TestWordsAndVariables(testtools.TestCase):
    def test_loader_cmdline_quotes_like_grub(self) -> None:
        self.assertEqual(
            '/vmlinuz a "b c" d\\"e f\\\\g',
            loader_cmdline(["/vmlinuz", "a", "b c", 'd"e', "f\\g"]),
        )

    def test_variables_quotes_and_splitting(self) -> None:
        cfg = "set opts='quiet  splash'\nset ro=ro\nexport opts ro\n" + _entry(
            'linux /boot/vmlinuz root=${x}/dev/vda1 $ro $opts "$opts" '
            "'$ro' \\$lit x\\ y \"\"\ninitrd /boot/initrd"
        )
        (entry,) = _menu(cfg).entries
        self.assertEqual(
            '/boot/vmlinuz root=/dev/vda1 ro quiet splash "quiet  splash" '
            '$ro $lit "x y" ',
            entry.cmdline,
        )
        self.assertEqual(((_ROOT, "/boot/initrd"),), entry.initrds)

    def test_unexported_variables_do_not_reach_an_entry(self) -> None:
        cfg = "set kopt=quiet\n" + _entry("linux /vmlinuz $kopt")
        self.assertEqual("/vmlinuz", _menu(cfg).entries[0].cmdline)

    def test_load_env_variables_reach_the_menu_context(self) -> None:
        cfg = "load_env\nexport kernelopts\n" + _entry("linux /vmlinuz $kernelopts")
        env = "# GRUB Environment Block\nkernelopts=root=/dev/vda2 ro\n####\n"
        menu = _menu(cfg, **{"/boot/grub/grubenv": env})
        self.assertEqual("/vmlinuz root=/dev/vda2 ro", menu.entries[0].cmdline)

    def test_device_paths_and_search_by_label(self) -> None:
        cfg = _entry(
            "search --no-floppy --label --set=boot root\n"
            "linux ($boot)/vmlinuz ro\ninitrd ($boot)/initrd (hd0,gpt1)/extra"
        )
        (entry,) = _menu(cfg).entries
        self.assertEqual(f"({_ROOT})/vmlinuz ro", entry.cmdline)
        self.assertEqual(((_ROOT, "/initrd"), (_ESP, "/extra")), entry.initrds)

    def test_decided_conditions_pick_their_branch(self) -> None:
        cfg = _entry(
            'if [ "$grub_platform" = "efi" ]; then set k=efi; else set k=bios; fi\n'
            "if [ -e /boot/present ]; then set e=yes; fi\n"
            "if [ ! -s /boot/absent ]; then set a=no; fi\n"
            "linux /vmlinuz $k $e $a"
        )
        menu = _menu(cfg, **{"/boot/present": "x"})
        self.assertEqual("/vmlinuz efi yes no", menu.entries[0].cmdline)

    def test_submenu_entries_and_function_calls(self) -> None:
        cfg = (
            "function opts { set o=quiet; }\n"
            "submenu 'More' {\n" + _entry("opts\nlinux /vmlinuz $o") + "}\n"
        )
        self.assertEqual("/vmlinuz quiet", _menu(cfg).entries[0].cmdline)


class TestRefusals(testtools.TestCase):
    def _refused(self, cfg: str, *words: str, **root: str) -> None:
        error = self.assertRaises(DiskImageError, _menu, cfg, **root)
        for word in words:
            self.assertIn(word, str(error))

    def test_linux_in_an_undecided_condition_is_refused_naming_the_line(self) -> None:
        cfg = _entry("if loadfont unicode; then\nlinux /vmlinuz a\nfi")
        self._refused(cfg, "line 3", "linux")

    def test_a_variable_set_in_an_undecided_branch_is_refused_in_linux(self) -> None:
        cfg = _entry("if loadfont x; then set o=a; fi\nlinux /vmlinuz $o")
        self._refused(cfg, "line 3", "cannot decide")

    def test_an_undecided_branch_without_boot_commands_is_skipped(self) -> None:
        cfg = "if loadfont x; then insmod gfxterm; set gfxmode=auto; fi\n" + _entry(
            "linux /vmlinuz"
        )
        self.assertEqual("/vmlinuz", _menu(cfg).entries[0].cmdline)

    def test_loops_are_refused(self) -> None:
        self._refused("for x in a b; do echo $x; done\n", "line 1", "for")

    def test_unknown_commands_are_refused(self) -> None:
        self._refused(_entry("linux /vmlinuz\nfrobnicate now"), "line 3", "frobnicate")

    def test_initrd_before_linux_and_two_linux_are_refused(self) -> None:
        self._refused(_entry("initrd /initrd\nlinux /vmlinuz"), "initrd before linux")
        self._refused(_entry("linux /a\nlinux /b"), "second linux")

    def test_missing_configfile_and_failed_search_are_refused(self) -> None:
        self._refused("configfile /boot/grub/other.cfg\n", "not found")
        self._refused("search.fs_uuid 0000 root\n", "no file system has fs_uuid")

    def test_unterminated_quotes_and_blocks_are_refused(self) -> None:
        self.assertRaises(DiskImageError, parse, "echo 'abc\n", "t")
        self.assertRaises(DiskImageError, parse, "menuentry x {\nlinux /a\n", "t")
        self.assertRaises(DiskImageError, parse, "if true; then\necho\n", "t")
        self.assertRaises(DiskImageError, parse, "}\n", "t")

    def test_doubling_a_variable_is_bounded(self) -> None:
        self._refused("set a=xxxxxxxx\n" + "set a=$a$a\n" * 40, "expands to over")

    def test_configfile_recursion_is_bounded(self) -> None:
        self._refused("configfile /boot/grub/grub.cfg\n", "nested")
