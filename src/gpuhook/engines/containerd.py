"""Register gpuhook-runtime with containerd (pure: text in, text out).

``config.toml`` (config version 2 for containerd 1.x, 3 for containerd 2.x) gets a CRI runtime
``<name>`` of type ``io.containerd.runc.v2`` whose options are those of the existing ``runc``
runtime (``SystemdCgroup`` and the rest) plus ``BinaryName = <runtime path>``, and, as the
default, ``default_runtime_name = <name>``. The runtime also lets through the annotations gpuhook
reads: ``container_annotations`` (set by the kubelet from device plugins, so pod users cannot set
them) get ``cdi.k8s.io/*``, ``pod_annotations`` get ``gpuhook.io/*``. The file is edited with
tomlkit, which keeps comments and layout; every result is re-read with :mod:`tomllib` and compared
with the intended change, so an edit that would alter anything else is refused, never written.

The runtime can also go into a drop-in file that the main config imports. containerd 1.x replaces
a whole plugin section with an imported one (containerd/containerd#5837), so a version-2 drop-in
carries a copy of the main file's CRI section; containerd 2.x merges imports key by key, so a
version-3 drop-in holds only gpuhook's keys.

CDI: containerd 1.7+ resolves ``cdi.k8s.io/*`` annotations itself when the CRI plugin's
``enable_cdi`` is on (the default in containerd 2.x, whose v3 config keeps it with
``cdi_spec_dirs``, default ``/etc/cdi`` and ``/var/run/cdi``, in ``io.containerd.cri.v1.runtime``).
Registration leaves both keys as they are and its notes say where the CDI spec must be
(:func:`gpuhook.engines.readers.cdi_settings`); ``gpuhook doctor`` checks that gpuhook's spec is
there.

Unconfiguring removes the runtime, and, where ``<name>`` was the default, gives the default back
to runc: ``default_runtime_name = "runc"`` (what ``containerd config default`` writes).
Malformed input raises :class:`gpuhook.errors.RegistrationError` with one line.
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
import json
import re
import tomllib
from typing import TYPE_CHECKING, Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from gpuhook.engines.common import (
    DEFAULT_NAME,
    DEFAULT_RUNTIME_PATH,
    RUNC,
    RUNC_TYPE,
    Edit,
    check_name,
    toml_load,
)
from gpuhook.engines.readers import CRI_PLUGIN, cdi_settings
from gpuhook.errors import RegistrationError

if TYPE_CHECKING:
    from tomlkit.items import Table
    from tomlkit.toml_document import TOMLDocument

CONTAINER_ANNOTATIONS = ("cdi.k8s.io/*",)
POD_ANNOTATIONS = ("gpuhook.io/*",)
_HEADER = re.compile(r"^\s*\[")


def config_version(plain: dict[str, Any], source: str) -> int:
    version = plain.get("version")
    if version is None:
        raise RegistrationError(
            f"{source}: no 'version = 2' (containerd 1.x) or 'version = 3' (containerd 2.x) line; "
            "gpuhook edits config versions 2 and 3 only"
        )
    if isinstance(version, bool) or version not in CRI_PLUGIN:
        raise RegistrationError(
            f"{source}: version: config version {version!r} is not supported (2 or 3)"
        )
    return int(version)


def _walk(plain: dict[str, Any], keys: tuple[str, ...], source: str) -> dict[str, Any] | None:
    """The plain table at ``keys``, None where absent; a non-table on the way is an error."""
    node: Any = plain
    for i, key in enumerate(keys):
        node = node.get(key)
        if node is None:
            return None
        if not isinstance(node, dict):
            where = ".".join(_toml_key(k) for k in keys[: i + 1])
            raise RegistrationError(f"{source}: {where}: must be a table")
    return node  # type: ignore[no-any-return]


def _toml_key(key: str) -> str:
    return key if re.match(r"^[A-Za-z0-9_-]+$", key) else json.dumps(key)


def _cri_path(version: int) -> tuple[str, ...]:
    return ("plugins", CRI_PLUGIN[version], "containerd")


def _check_containerd(plain: dict[str, Any], version: int, name: str, source: str) -> None:
    cri = _walk(plain, _cri_path(version), source)
    if cri is None:
        return
    runtimes = _walk(plain, (*_cri_path(version), "runtimes"), source) or {}
    for key in (RUNC, name):
        if key in runtimes:
            _walk(plain, (*_cri_path(version), "runtimes", key), source)
            _walk(plain, (*_cri_path(version), "runtimes", key, "options"), source)
    default = cri.get("default_runtime_name")
    if default is not None and not isinstance(default, str):
        raise RegistrationError(
            f"{source}: {'.'.join(_toml_key(k) for k in _cri_path(version))}.default_runtime_name:"
            " must be a string"
        )


# --- containerd: the intended change, on plain data ---------------------------------------------


def _wanted_runtime(
    runtimes: dict[str, Any], name: str, runtime_path: str
) -> tuple[dict[str, Any], str]:
    """The runtime table gpuhook wants, and where its options come from (for the notes)."""
    current = runtimes.get(name)
    if isinstance(current, dict):
        table = copy.deepcopy(current)
        origin = ""
    else:
        runc = runtimes.get(RUNC)
        table = {}
        if isinstance(runc, dict) and isinstance(runc.get("options"), dict):
            table["options"] = copy.deepcopy(runc["options"])
            origin = f"options copied from runtime {RUNC}"
        else:
            origin = f"no runtime {RUNC} to copy options from"
    table["runtime_type"] = RUNC_TYPE
    options = table.setdefault("options", {})
    options["BinaryName"] = runtime_path
    for key, wanted in (
        ("container_annotations", CONTAINER_ANNOTATIONS),
        ("pod_annotations", POD_ANNOTATIONS),
    ):
        have = table.get(key)
        have_list = list(have) if isinstance(have, list) else []
        table[key] = have_list + [w for w in wanted if w not in have_list]
    return table, origin


def _plain_configure(
    plain: dict[str, Any], version: int, name: str, runtime_path: str, set_default: bool
) -> dict[str, Any]:
    out: dict[str, Any] = _plain(plain)
    node = out
    for key in _cri_path(version):
        node = node.setdefault(key, {})
    runtimes = node.setdefault("runtimes", {})
    runtimes[name], _ = _wanted_runtime(runtimes, name, runtime_path)
    if set_default:
        node["default_runtime_name"] = name
    return out


# --- containerd: the edit, with tomlkit ---------------------------------------------------------


def _tk_get(container: Any, key: str) -> Any:
    try:
        return container[key]
    except (KeyError, tomlkit.exceptions.NonExistentKey):
        return None


def _tk_table(container: Any, keys: tuple[str, ...]) -> Table | None:
    node = container
    for key in keys:
        node = _tk_get(node, key)
        if node is None:
            return None
    return node  # type: ignore[no-any-return]


def _tk_ensure(container: Any, keys: tuple[str, ...]) -> Any:
    """The table at ``keys``, creating missing ones as super tables (no header of their own)."""
    node = container
    for key in keys:
        child = _tk_get(node, key)
        if child is None:
            child = tomlkit.table(is_super_table=True)
            node[key] = child
            child = node[key]
        node = child
    return node


def _quote(doc_text: str, plugin: str) -> str:
    """The quote character the file uses for the plugin name (containerd 2.x writes '...')."""
    if f"'{plugin}'" in doc_text and f'"{plugin}"' not in doc_text:
        return "'"
    return '"'


def _toml_string(value: str, quote: str) -> str:
    if quote == "'" and "'" not in value and "\n" not in value:
        return f"'{value}'"
    return json.dumps(value, ensure_ascii=False)


def _tk_string(value: str, quote: str) -> Any:
    """A tomlkit string item in the file's quote style."""
    literal = quote == "'" and "'" not in value and "\n" not in value
    return tomlkit.string(value, literal=literal)


def _toml_value(value: Any, quote: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value, quote)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v, quote) for v in value) + "]"
    return str(tomlkit.item(value).as_string())


def _indent_of(text: str, needle: str) -> tuple[str, str] | None:
    """(header indent, key indent) of the table whose header line contains ``needle``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if _HEADER.match(line) and needle in line.replace("'", '"'):
            header = line[: len(line) - len(line.lstrip())]
            for nxt in lines[i + 1 :]:
                if nxt.strip() and not nxt.lstrip().startswith("#"):
                    if _HEADER.match(nxt):
                        break
                    return header, nxt[: len(nxt) - len(nxt.lstrip())]
            return header, header + "  "
    return None


def _runtime_snippet(
    doc_text: str,
    version: int,
    name: str,
    table: dict[str, Any],
    option_items: list[tuple[str, str]],
) -> str:
    """TOML text of the new runtime table, laid out like the file's runc runtime."""
    plugin = CRI_PLUGIN[version]
    q = _quote(doc_text, plugin)
    prefix = f"plugins.{q}{plugin}{q}.containerd.runtimes.{_toml_key(name)}"
    runc_layout = _indent_of(doc_text, f'"{plugin}".containerd.runtimes.runc]')
    head, key_indent = runc_layout if runc_layout else ("", "  ")
    step = key_indent[len(head) :] if key_indent.startswith(head) else "  "
    lines = [f"{head}[{prefix}]"]
    for key in ("runtime_type", "container_annotations", "pod_annotations"):
        lines.append(f"{key_indent}{key} = {_toml_value(table[key], q)}")
    lines += ["", f"{head}{step}[{prefix}.options]"]
    for key, rendered in option_items:
        lines.append(f"{key_indent}{step}{key} = {rendered}")
    return "\n".join(lines) + "\n"


def _option_items(source_options: Any, runtime_path: str, quote: str) -> list[tuple[str, str]]:
    """(key, rendered value) for the new runtime's options: the source's own text for each
    copied option (so its style survives), BinaryName set to gpuhook-runtime."""
    items: list[tuple[str, str]] = []
    seen = False
    if source_options is not None:
        for key, value in source_options.items():
            if key == "BinaryName":
                items.append((key, _toml_string(runtime_path, quote)))
                seen = True
            else:
                rendered = value.as_string() if hasattr(value, "as_string") else None
                items.append((_toml_key(key), rendered or _toml_value(value, quote)))
    if not seen:
        items.insert(0, ("BinaryName", _toml_string(runtime_path, quote)))
    return items


def _space_new_headers(old: str, new: str) -> str:
    """Put a blank line before a table header that the edit added, as in the files containerd
    writes."""
    old_lines = old.splitlines()
    new_lines = new.splitlines()
    added: set[int] = set()
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "insert":
            added.update(range(j1, j2))
        elif tag == "replace":  # lines beyond those replaced one for one are new
            added.update(range(j1 + (i2 - i1), j2))
    out: list[str] = []
    for j, line in enumerate(new_lines):
        if j > 0 and _HEADER.match(line) and out and out[-1].strip() and j in added:
            out.append("")
        out.append(line)
    text = "\n".join(out) + "\n"
    if not old.endswith("\n\n"):
        text = text.rstrip("\n") + "\n"
    return text


def _verify(text: str, expected: dict[str, Any], source: str) -> None:
    try:
        got = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RegistrationError(
            f"{source}: internal error: the edited file would not parse ({exc}); nothing written"
        ) from None
    if not _same(got, expected):
        raise RegistrationError(
            f"{source}: internal error: the edit would change more than gpuhook's keys; "
            "nothing written (please report this with the file)"
        )


def _edit_runtime(
    doc: TOMLDocument,
    text: str,
    version: int,
    name: str,
    runtime_path: str,
    set_default: bool,
) -> Table | None:
    """Apply the runtime (and the default) to a tomlkit document, in the file's style. Returns
    the runtime table when it was added."""
    cri_keys = _cri_path(version)
    q = _quote(text, CRI_PLUGIN[version])
    added: Table | None = None
    runtimes = _tk_ensure(doc, (*cri_keys, "runtimes"))
    current = _tk_get(runtimes, name)
    plain_runtimes = _plain(runtimes.unwrap())
    wanted, _ = _wanted_runtime(plain_runtimes, name, runtime_path)
    if current is None:
        runc = _tk_get(runtimes, RUNC)
        runc_options = _tk_get(runc, "options") if runc is not None else None
        snippet = _runtime_snippet(
            text, version, name, wanted, _option_items(runc_options, runtime_path, q)
        )
        parsed = _tk_table(tomlkit.parse(snippet), (*cri_keys, "runtimes", name))
        runtimes.raw_append(name, parsed)
        added = parsed
    else:
        if _tk_get(current, "runtime_type") != RUNC_TYPE:
            current["runtime_type"] = _tk_string(RUNC_TYPE, q)
        options = _tk_get(current, "options")
        if options is None:
            current["options"] = tomlkit.table()
            options = current["options"]
        if _tk_get(options, "BinaryName") != runtime_path:
            options["BinaryName"] = _tk_string(runtime_path, q)
        for key in ("container_annotations", "pod_annotations"):
            have = _tk_get(current, key)
            if have is None:
                current[key] = [_tk_string(w, q) for w in wanted[key]]
            else:
                for pattern in wanted[key]:
                    if pattern not in list(have):
                        have.append(_tk_string(pattern, q))
    if set_default:
        cri = _tk_table(doc, cri_keys)
        if cri is None or _tk_get(cri, "default_runtime_name") != name:
            cri = _tk_ensure(doc, cri_keys)
            cri["default_runtime_name"] = _tk_string(name, q)
    return added


def new_containerd_text(version: int) -> str:
    """The start of a config file that did not exist (or was empty)."""
    return f"version = {version}\n"


def containerd_configure(
    text: str | None,
    *,
    name: str = DEFAULT_NAME,
    runtime_path: str = DEFAULT_RUNTIME_PATH,
    set_default: bool = False,
    source: str = "config.toml",
    new_version: int = 2,
) -> Edit:
    """Add (or update) the CRI runtime ``<name>`` and, with ``set_default``, make it the default.
    ``new_version`` is the config version of a file that does not exist yet."""
    check_name(name)
    original = text or ""
    if not original.strip():
        original = ""
    text = original or new_containerd_text(new_version)
    doc, plain = toml_load(text, source)
    version = config_version(plain, source)
    _check_containerd(plain, version, name, source)
    expected = _plain_configure(plain, version, name, runtime_path, set_default)
    notes = _configure_notes(plain, version, name, runtime_path, set_default)
    if original and _same(plain, expected):
        return Edit(original, False, notes)
    try:
        added = _edit_runtime(doc, text, version, name, runtime_path, set_default)
        new = tomlkit.dumps(doc)
        if added is not None:
            new = _separate_block(new, version, name)
        new = _space_new_headers(text, new)
    except (TOMLKitError, AttributeError, TypeError, KeyError, ValueError):
        new = ""
    if not _parses_as(new, expected):
        # tomlkit 0.11 mishandles some layouts (tables declared out of order): fall back to
        # plain text edits, which the same check must accept.
        new = _text_configure(text, plain, version, name, runtime_path, set_default, source)
    _verify(new, expected, source)
    return Edit(new, True, notes + cdi_notes(plain, version))


def cdi_notes(plain: dict[str, Any], version: int) -> tuple[str, ...]:
    """What the CRI plugin's ``enable_cdi`` and ``cdi_spec_dirs`` mean for gpuhook (left as
    they are): with CDI on, containerd resolves ``cdi.k8s.io/*`` annotations itself and fails a
    container whose device no spec in those folders names."""
    plugin = _walk(plain, ("plugins", CRI_PLUGIN[version]), "") or {}
    enabled, dirs = cdi_settings(plugin, version)
    if not enabled:
        return ("CDI: enable_cdi is off; gpuhook-runtime reads the cdi.k8s.io/* annotations",)
    where = ", ".join(dirs) or "?"
    return (
        f"CDI: enable_cdi is on: containerd injects cdi.k8s.io/* devices from the specs in "
        f"{where}; gpuhook's spec (cdi.output, kept by gpuhook inventory refresh) must be in "
        "one of them (gpuhook doctor checks)",
    )


def _plain(value: Any) -> Any:
    """A deep copy of tomllib (or unwrapped tomlkit) data as plain JSON types: dates and times
    become their text, so two readings of a file compare equal."""
    return json.loads(json.dumps(value, default=str))


def _same(a: Any, b: Any) -> bool:
    return bool(_plain(a) == _plain(b))


def _separate_block(text: str, version: int, name: str) -> str:
    """Lay out an added runtime block as ``<previous table>, one blank line, the block, then the
    blank lines that ended the previous table``: so removing the block and the one blank line
    before it gives back the file as it was."""
    lines = text.split("\n")
    own = _runtime_header_re(version, name)
    first = next((i for i, line in enumerate(lines) if own.match(line)), None)
    if first is None:
        return text
    last = first
    for i in range(first + 1, len(lines)):
        if _HEADER.match(lines[i]) and not own.match(lines[i]):
            break
        if lines[i].strip():
            last = i
    gap = first
    while gap > 0 and not lines[gap - 1].strip():
        gap -= 1
    moved = first - gap
    block = lines[first : last + 1]
    rest = lines[last + 1 :]
    while rest and not rest[0].strip():
        rest.pop(0)
    return "\n".join([*lines[:gap], "", *block, *([""] * moved), *rest])


def _runtime_header_re(version: int, name: str) -> re.Pattern[str]:
    n = re.escape(name)
    return _header_re(version, rf"\s*\.\s*runtimes\s*\.\s*(?:\"{n}\"|'{n}'|{n})(?:\s*\..*)?")


def _parses_as(text: str, expected: dict[str, Any]) -> bool:
    try:
        return bool(text) and _same(tomllib.loads(text), expected)
    except tomllib.TOMLDecodeError:
        return False


def _configure_notes(
    plain: dict[str, Any], version: int, name: str, runtime_path: str, set_default: bool
) -> tuple[str, ...]:
    notes: list[str] = []
    cri = _walk(plain, _cri_path(version), "") or {}
    runtimes = cri.get("runtimes") or {}
    wanted, origin = _wanted_runtime(runtimes, name, runtime_path)
    current = runtimes.get(name)
    if current is None:
        notes.append(f"added CRI runtime {name} ({RUNC_TYPE}, BinaryName {runtime_path}; {origin})")
    else:
        for key, value in wanted.items():
            if key != "options" and current.get(key) != value:
                notes.append(f"runtime {name}: {key} = {_toml_value(value, chr(34))}")
        if (current.get("options") or {}).get("BinaryName") != runtime_path:
            notes.append(f"runtime {name}: BinaryName = {runtime_path}")
    previous = cri.get("default_runtime_name")
    if set_default:
        if previous != name:
            notes.append(f"default runtime: {previous or RUNC} -> {name}")
    elif previous != name:
        notes.append(
            f"the default runtime stays {previous or RUNC}: only pods with runtimeClassName "
            f"{name} go through gpuhook (use --set-as-default)"
        )
    return tuple(notes)


def _header_re(version: int, suffix: str) -> re.Pattern[str]:
    plugin = re.escape(CRI_PLUGIN[version])
    return re.compile(
        rf"^\s*\[\s*plugins\s*\.\s*([\"'])?{plugin}\1?\s*\.\s*containerd{suffix}\s*\]\s*(#.*)?$"
    )


_DEFAULT_LINE = re.compile(r"^(\s*default_runtime_name\s*=\s*)([\"'])([^\"']*)\2(.*)$")


def _text_configure(
    text: str,
    plain: dict[str, Any],
    version: int,
    name: str,
    runtime_path: str,
    set_default: bool,
    source: str,
) -> str:
    """The same edit as plain text: append the runtime table, set the default in place."""
    cri = _walk(plain, _cri_path(version), source) or {}
    runtimes = cri.get("runtimes") or {}
    if name in runtimes:
        raise RegistrationError(
            f"{source}: cannot update runtime {name} in this layout safely; nothing written "
            f"(remove it with `gpuhook runtime unconfigure` first)"
        )
    q = _quote(text, CRI_PLUGIN[version])
    wanted, _ = _wanted_runtime(runtimes, name, runtime_path)
    runc_options = (runtimes.get(RUNC) or {}).get("options")
    items = [
        (_toml_key(k), _toml_value(v, q))
        for k, v in (runc_options or {}).items()
        if k != "BinaryName"
    ]
    items.insert(0, ("BinaryName", _toml_string(runtime_path, q)))
    lines = text.rstrip("\n").split("\n")
    if set_default and cri.get("default_runtime_name") != name:
        found = [i for i, line in enumerate(lines) if _DEFAULT_LINE.match(line)]
        headers = [i for i, line in enumerate(lines) if _header_re(version, "").match(line)]
        if len(found) == 1:
            m = _DEFAULT_LINE.match(lines[found[0]])
            if m is not None:
                lines[found[0]] = f"{m.group(1)}{_toml_string(name, q)}{m.group(4)}"
        elif not found and len(headers) == 1:
            lines.insert(headers[0] + 1, f"  default_runtime_name = {_toml_string(name, q)}")
        else:
            plugin = CRI_PLUGIN[version]
            lines += [
                "",
                f"[plugins.{q}{plugin}{q}.containerd]",
                f"  default_runtime_name = {_toml_string(name, q)}",
            ]
    snippet = _runtime_snippet("", version, name, wanted, items)
    if q == "'":
        snippet = snippet.replace(f'"{CRI_PLUGIN[version]}"', f"'{CRI_PLUGIN[version]}'")
    return "\n".join(lines) + "\n\n" + snippet.rstrip("\n") + "\n"


def _text_unconfigure(text: str, version: int, name: str) -> str:
    """Remove the runtime's tables (and the one blank line before them) and give the default
    back to runc, as plain text: the inverse of the layout :func:`_separate_block` makes. Blank
    and comment lines at the end of a block stay: they introduce the next table."""
    lines = text.split("\n")
    own = _runtime_header_re(version, name)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if own.match(line):
            end = i
            j = i + 1
            while j < len(lines) and not (_HEADER.match(lines[j]) and not own.match(lines[j])):
                stripped = lines[j].strip()
                if stripped and not stripped.startswith("#"):
                    end = j
                j += 1
            if out and not out[-1].strip():
                out.pop()
            i = end + 1
            continue
        m = _DEFAULT_LINE.match(line)
        if m and m.group(3) == name:
            out.append(f"{m.group(1)}{m.group(2)}{RUNC}{m.group(2)}{m.group(4)}")
        else:
            out.append(line)
        i += 1
    return "\n".join(out)


def containerd_unconfigure(
    text: str | None, *, name: str = DEFAULT_NAME, source: str = "config.toml"
) -> Edit:
    """Remove the CRI runtime ``<name>``; where it was the default, make runc the default."""
    check_name(name)
    if text is None or not text.strip():
        return Edit(text or "", False, ())
    doc, plain = toml_load(text, source)
    version = config_version(plain, source)
    _check_containerd(plain, version, name, source)
    cri_keys = _cri_path(version)
    expected: dict[str, Any] = _plain(plain)
    notes: list[str] = []
    node = expected
    for key in cri_keys:
        node = node.get(key) or {}
    if name in (node.get("runtimes") or {}):
        del node["runtimes"][name]
        notes.append(f"removed CRI runtime {name}")
    if node.get("default_runtime_name") == name:
        node["default_runtime_name"] = RUNC
        notes.append(f"default runtime: {name} -> {RUNC}")
    if not notes:
        return Edit(text, False, ())
    new = _text_unconfigure(text, version, name)
    if _parses_as(new, expected):
        return Edit(new, True, tuple(notes))
    try:
        runtimes = _tk_table(doc, (*cri_keys, "runtimes"))
        if runtimes is not None and _tk_get(runtimes, name) is not None:
            del runtimes[name]
        cri = _tk_table(doc, cri_keys)
        if cri is not None and _tk_get(cri, "default_runtime_name") == name:
            cri["default_runtime_name"] = _tk_string(RUNC, _quote(text, CRI_PLUGIN[version]))
        new = tomlkit.dumps(doc)
    except (TOMLKitError, AttributeError, TypeError, KeyError, ValueError):
        new = ""
    _verify(new, expected, source)
    return Edit(new, True, tuple(notes))


# --- containerd: drop-in files ------------------------------------------------------------------


def imports_of(plain: dict[str, Any], source: str) -> list[str]:
    imports = plain.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise RegistrationError(f"{source}: imports: must be an array of strings")
    return list(imports)


def _imported(imports: list[str], path: str) -> bool:
    return any(
        i == path or (any(c in i for c in "*?[") and fnmatch.fnmatch(path, i)) for i in imports
    )


def containerd_add_import(text: str, dropin_path: str, *, source: str = "config.toml") -> Edit:
    """Make the main config import ``dropin_path`` (unless an entry or a glob already does)."""
    doc, plain = toml_load(text, source)
    config_version(plain, source)
    imports = imports_of(plain, source)
    if _imported(imports, dropin_path):
        return Edit(text, False, (f"{dropin_path} is already imported",))
    expected = _plain(plain)
    expected["imports"] = [*imports, dropin_path]
    current = _tk_get(doc, "imports")
    if current is None:
        _insert_top_level(doc, "imports", [dropin_path])
    else:
        current.append(dropin_path)
    new = tomlkit.dumps(doc)
    _verify(new, expected, source)
    return Edit(new, True, (f"imports += {dropin_path}",))


def _insert_top_level(doc: TOMLDocument, key: str, value: Any) -> None:
    """Add a top-level key after ``version`` (before the first table)."""
    keys = list(doc.keys())
    if "version" in keys:
        doc.add(key, value)  # tomlkit puts plain keys before the first table
    else:
        doc[key] = value


def containerd_remove_import(text: str, dropin_path: str, *, source: str = "config.toml") -> Edit:
    doc, plain = toml_load(text, source)
    config_version(plain, source)
    imports = imports_of(plain, source)
    if dropin_path not in imports:
        return Edit(text, False, ())
    expected = _plain(plain)
    expected["imports"] = [i for i in imports if i != dropin_path]
    current: Any = doc["imports"]
    while dropin_path in list(current):
        current.remove(dropin_path)
    new = tomlkit.dumps(doc)
    _verify(new, expected, source)
    return Edit(new, True, (f"imports -= {dropin_path}",))


def containerd_dropin(
    main_text: str | None,
    dropin_text: str | None,
    *,
    name: str = DEFAULT_NAME,
    runtime_path: str = DEFAULT_RUNTIME_PATH,
    set_default: bool = False,
    source: str = "config.toml",
    dropin_source: str = "gpuhook.toml",
    new_version: int = 2,
) -> tuple[Edit, Edit]:
    """(main config edit, drop-in edit). The drop-in of a version-2 config starts from a copy of
    the main file's CRI section (containerd 1.x replaces whole plugin sections on import)."""
    check_name(name)
    main = main_text if main_text and main_text.strip() else new_containerd_text(new_version)
    _doc, plain = toml_load(main, source)
    version = config_version(plain, source)
    _check_containerd(plain, version, name, source)
    if dropin_text and dropin_text.strip():
        _d, dplain = toml_load(dropin_text, dropin_source)
        if config_version(dplain, dropin_source) != version:
            raise RegistrationError(
                f"{dropin_source}: config version differs from {source} (version {version})"
            )
        start = dropin_text
    else:
        start = _dropin_base(main, plain, version, source)
    dropin = containerd_configure(
        start,
        name=name,
        runtime_path=runtime_path,
        set_default=set_default,
        source=dropin_source,
    )
    if not (dropin_text and dropin_text.strip()):
        dropin = Edit(dropin.text, True, dropin.notes)
    main_edit = containerd_add_import(main, dropin_source, source=source)
    if main_text is None or not main_text.strip():
        main_edit = Edit(main_edit.text, True, main_edit.notes)
    return main_edit, dropin


def _dropin_base(main: str, plain: dict[str, Any], version: int, source: str) -> str:
    header = (
        "# Written by `gpuhook runtime configure --drop-in`: registers gpuhook-runtime as a CRI\n"
        "# runtime. `gpuhook runtime unconfigure --drop-in` removes this file.\n"
    )
    if version == 2 and _walk(plain, ("plugins", CRI_PLUGIN[2]), source) is not None:
        doc, _ = toml_load(main, source)
        for key in list(doc.keys()):
            if key != "plugins":
                del doc[key]
        plugins: Any = doc["plugins"]
        for key in list(plugins.keys()):
            if key != CRI_PLUGIN[2]:
                del plugins[key]
        body = tomlkit.dumps(doc).lstrip("\n")
        return (
            header + "# containerd 1.x replaces a whole plugin section from an import, so this\n"
            f'# file carries a copy of {source}\'s [plugins."{CRI_PLUGIN[2]}"] section:\n'
            "# make CRI changes here from now on.\n"
            f"version = {version}\n\n{body}"
        )
    return header + f"version = {version}\n"
