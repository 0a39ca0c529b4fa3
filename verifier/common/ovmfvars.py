"""The variables of an OVMF variable store file (``OVMF_VARS.fd``): the
Secure Boot key databases a VM starts with.

The file is an EFI firmware volume (PI specification, volume 3,
``EFI_FIRMWARE_VOLUME_HEADER``, signature ``_FVH``) whose first bytes
after its header are EDK2's authenticated variable store
(``MdeModulePkg/Include/Guid/VariableFormat.h``): a ``VARIABLE_STORE_HEADER``
(GUID ``aaf32c78-947b-439a-a180-2e144ec37792``, size, format, state) then
``AUTHENTICATED_VARIABLE_HEADER`` records (start id ``0x55AA``, state,
attributes, monotonic count, time stamp, public key index, name size,
data size, vendor GUID), each followed by its UTF-16 name and its data
and aligned to 4 bytes. A record in state ``0x3F`` (``VAR_ADDED``) is
live; the last live record of a name wins.

Any defect raises :class:`~verifier.common.diskimage.DiskImageError`.
"""

from __future__ import annotations

import struct
import uuid

from verifier.common.diskimage import DiskImageError

__all__ = ["read_variables"]

_FV_SIGNATURE = b"_FVH"
_AUTH_STORE = uuid.UUID("aaf32c78-947b-439a-a180-2e144ec37792")
_STORE_HEADER = struct.Struct("<16sIBB2xI")
_VAR_HEADER = struct.Struct("<HBBIQ16sIII16s")
_START_ID, _VAR_ADDED = 0x55AA, 0x3F
_MAX_VARIABLES = 4096
_MAX_FILE = 64 << 20


def read_variables(data: bytes) -> dict[tuple[str, uuid.UUID], bytes]:
    """(name, vendor GUID) -> data of every live variable of the store.

    Raises:
        DiskImageError: not a firmware volume holding an authenticated
            variable store, or a record that does not fit.
    """
    if len(data) > _MAX_FILE:
        raise DiskImageError(f"OVMF variables: file over {_MAX_FILE} bytes")
    if len(data) < 56 or data[40:44] != _FV_SIGNATURE:
        raise DiskImageError("OVMF variables: not a firmware volume (no _FVH)")
    (length,) = struct.unpack_from("<Q", data, 32)
    (header_length,) = struct.unpack_from("<H", data, 48)
    if length > len(data) or header_length + _STORE_HEADER.size > length:
        raise DiskImageError(
            f"OVMF variables: volume of {length} bytes does not fit the file"
        )
    guid, size, _, _, _ = _STORE_HEADER.unpack_from(data, header_length)
    if uuid.UUID(bytes_le=guid) != _AUTH_STORE:
        raise DiskImageError(
            "OVMF variables: not an authenticated variable store "
            f"({uuid.UUID(bytes_le=guid)})"
        )
    end = header_length + size
    if size < _STORE_HEADER.size or end > length:
        raise DiskImageError(f"OVMF variables: store size {size} exceeds the volume")
    out: dict[tuple[str, uuid.UUID], bytes] = {}
    at = header_length + _STORE_HEADER.size
    for _ in range(_MAX_VARIABLES):
        at = (at + 3) & ~3
        if at + _VAR_HEADER.size > end:
            return out
        fields = _VAR_HEADER.unpack_from(data, at)
        start, state, name_size, data_size, vendor = (
            fields[0], fields[1], fields[7], fields[8], fields[9],
        )  # fmt: skip
        if start != _START_ID:
            return out
        name_at = at + _VAR_HEADER.size
        data_at = name_at + name_size
        if name_size % 2 or data_at + data_size > end:
            raise DiskImageError(
                f"OVMF variables: record at {at}: name {name_size} and data "
                f"{data_size} bytes do not fit the store"
            )
        if state == _VAR_ADDED:
            name = data[name_at:data_at].decode("utf-16-le", "replace")
            key = (name.split("\0", 1)[0], uuid.UUID(bytes_le=vendor))
            out[key] = bytes(data[data_at : data_at + data_size])
        at = data_at + data_size
    raise DiskImageError(f"OVMF variables: over {_MAX_VARIABLES} records")
