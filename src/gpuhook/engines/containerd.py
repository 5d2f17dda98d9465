"""Register gpuhook-runtime with containerd (pure: text in, text out).

``config.toml`` (config version 2 for containerd 1.x, 3 or 4 for containerd 2.x) gets a CRI runtime
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
version-3 drop-in holds only gpuhook's keys (:mod:`gpuhook.engines.containerd_dropin`).

CDI: containerd 1.7+ resolves ``cdi.k8s.io/*`` annotations itself when the CRI plugin's
``enable_cdi`` is on (the default in containerd 2.x, whose v3 config keeps it with
``cdi_spec_dirs``, default ``/etc/cdi`` and ``/var/run/cdi``, in ``io.containerd.cri.v1.runtime``).
Registration leaves both keys as they are and its notes say where the CDI spec must be
(:func:`gpuhook.engines.readers.cdi_settings`); ``gpuhook doctor`` checks that gpuhook's spec is
there.

Unconfiguring removes the runtime, and, where ``<name>`` was the default, gives the default back
as it was: runc, another runtime, or no ``default_runtime_name`` at all (the line and its marker
comment: :mod:`gpuhook.engines.containerd_default`), so that the file is byte for byte the one
configure read. ``base_options`` are runc's options in the merged config (``containerd config
dump``: :mod:`gpuhook.engines.containerd_dump`), which a new runtime carries over the file's.
Malformed input raises :class:`gpuhook.errors.RegistrationError` with one line. Reading the
file, writing in its style and checking an edit are :mod:`gpuhook.engines.containerd_toml`'s.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from gpuhook.engines import containerd_default as cdefault
from gpuhook.engines import containerd_toml as ctoml
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
    from collections.abc import Mapping

    from tomlkit.items import Table
    from tomlkit.toml_document import TOMLDocument


CONTAINER_ANNOTATIONS = ("cdi.k8s.io/*",)


POD_ANNOTATIONS = ("gpuhook.io/*",)


def _wanted_runtime(
    runtimes: dict[str, Any],
    name: str,
    runtime_path: str,
    base: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], str]:
    """The runtime table gpuhook wants, and where its options come from (for the notes).
    ``base``: the options of runc as the merged config has them (root file and drop-ins,
    ``containerd config dump``), which win over this file's."""
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
        if base:
            table["options"] = carried(table.get("options", {}), base)
            origin = f"options copied from runtime {RUNC} of the merged config"
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


# Carried from the merged config even at its zero value: the cgroup driver must match the
# kubelet's, and a reader of the file should see which one gpuhook's runtime uses.
ALWAYS_CARRIED = frozenset({"SystemdCgroup"})


def carried(own: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The options a new runtime gets: this file's runc options (``own``), each replaced by the
    merged config's value (``base``), plus the merged config's other options that are not zero
    values (a dump lists every option; an absent one is its zero value anyway)."""
    out = copy.deepcopy(dict(own))
    for key, value in base.items():
        if key in out or key in ALWAYS_CARRIED or value not in ("", 0, False, [], {}):
            out[key] = copy.deepcopy(value)
    out.pop("BinaryName", None)
    return out


def _plain_configure(
    plain: dict[str, Any],
    version: int,
    name: str,
    runtime_path: str,
    set_default: bool,
    base: Mapping[str, Any] | None,
) -> dict[str, Any]:
    out: dict[str, Any] = ctoml.plain(plain)
    node = out
    for key in ctoml.cri_path(version):
        node = node.setdefault(key, {})
    runtimes = node.setdefault("runtimes", {})
    runtimes[name], _ = _wanted_runtime(runtimes, name, runtime_path, base)
    if set_default:
        node["default_runtime_name"] = name
    return out


def _runtime_snippet(
    doc_text: str,
    version: int,
    name: str,
    table: dict[str, Any],
    option_items: list[tuple[str, str]],
) -> str:
    """TOML text of the new runtime table, laid out like the file's runc runtime."""
    plugin = CRI_PLUGIN[version]
    q = ctoml.quote(doc_text, plugin)
    prefix = f"plugins.{q}{plugin}{q}.containerd.runtimes.{ctoml.toml_key(name)}"
    runc_layout = ctoml.indent_of(doc_text, f'"{plugin}".containerd.runtimes.runc]')
    head, key_indent = runc_layout if runc_layout else ("", "  ")
    step = key_indent[len(head) :] if key_indent.startswith(head) else "  "
    lines = [f"{head}[{prefix}]"]
    for key in ("runtime_type", "container_annotations", "pod_annotations"):
        lines.append(f"{key_indent}{key} = {ctoml.toml_value(table[key], q)}")
    lines += ["", f"{head}{step}[{prefix}.options]"]
    for key, rendered in option_items:
        lines.append(f"{key_indent}{step}{key} = {rendered}")
    return "\n".join(lines) + "\n"


def _option_items(
    source_options: Any, runtime_path: str, quote: str, base: Mapping[str, Any] | None = None
) -> list[tuple[str, str]]:
    """(key, rendered value) for the new runtime's options: the source's own text for each
    copied option (so its style survives) unless the merged config's ``base`` says otherwise,
    then ``base``'s other options, BinaryName set to gpuhook-runtime."""
    own = source_options.unwrap() if source_options is not None else {}
    base = carried(own, base) if base else {}
    items: list[tuple[str, str]] = []
    seen = False
    for key, value in source_options.items() if source_options is not None else ():
        if key == "BinaryName":
            items.append((key, ctoml.toml_string(runtime_path, quote)))
            seen = True
        elif key in base and not ctoml.same(base[key], own.get(key)):
            items.append((ctoml.toml_key(key), ctoml.toml_value(base.pop(key), quote)))
        else:
            base.pop(key, None)
            rendered = value.as_string() if hasattr(value, "as_string") else None
            items.append((ctoml.toml_key(key), rendered or ctoml.toml_value(value, quote)))
    items += [(ctoml.toml_key(k), ctoml.toml_value(v, quote)) for k, v in base.items()]
    if not seen:
        items.insert(0, ("BinaryName", ctoml.toml_string(runtime_path, quote)))
    return items


def _edit_runtime(
    doc: TOMLDocument,
    text: str,
    version: int,
    name: str,
    runtime_path: str,
    base: Mapping[str, Any] | None,
) -> Table | None:
    """Apply the runtime to a tomlkit document, in the file's style (the default is set as
    text: :mod:`.containerd_default`). Returns the runtime table when it was added."""
    cri_keys = ctoml.cri_path(version)
    q = ctoml.quote(text, CRI_PLUGIN[version])
    added: Table | None = None
    runtimes = ctoml.tk_ensure(doc, (*cri_keys, "runtimes"))
    current = ctoml.tk_get(runtimes, name)
    plain_runtimes = ctoml.plain(runtimes.unwrap())
    wanted, _ = _wanted_runtime(plain_runtimes, name, runtime_path, base)
    if current is None:
        runc = ctoml.tk_get(runtimes, RUNC)
        runc_options = ctoml.tk_get(runc, "options") if runc is not None else None
        snippet = _runtime_snippet(
            text, version, name, wanted, _option_items(runc_options, runtime_path, q, base)
        )
        parsed = ctoml.tk_table(tomlkit.parse(snippet), (*cri_keys, "runtimes", name))
        runtimes.raw_append(name, parsed)
        added = parsed
    else:
        if ctoml.tk_get(current, "runtime_type") != RUNC_TYPE:
            current["runtime_type"] = ctoml.tk_string(RUNC_TYPE, q)
        options = ctoml.tk_get(current, "options")
        if options is None:
            current["options"] = tomlkit.table()
            options = current["options"]
        if ctoml.tk_get(options, "BinaryName") != runtime_path:
            options["BinaryName"] = ctoml.tk_string(runtime_path, q)
        for key in ("container_annotations", "pod_annotations"):
            have = ctoml.tk_get(current, key)
            if have is None:
                current[key] = [ctoml.tk_string(w, q) for w in wanted[key]]
            else:
                for pattern in wanted[key]:
                    if pattern not in list(have):
                        have.append(ctoml.tk_string(pattern, q))
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
    base_options: Mapping[str, Any] | None = None,
) -> Edit:
    """Add (or update) the CRI runtime ``<name>`` and, with ``set_default``, make it the default.
    ``new_version`` is the config version of a file that does not exist yet; ``base_options``
    the options of runc in the merged config (``containerd config dump``), carried by a new
    runtime over this file's own."""
    check_name(name)
    original = text or ""
    if not original.strip():
        original = ""
    text = original or new_containerd_text(new_version)
    doc, plain = toml_load(text, source)
    version = ctoml.config_version(plain, source)
    ctoml.check_shape(plain, version, name, source)
    expected = _plain_configure(plain, version, name, runtime_path, set_default, base_options)
    notes = _configure_notes(plain, version, name, runtime_path, set_default, base_options)
    if original and ctoml.same(plain, expected):
        return Edit(original, False, notes)
    q = ctoml.quote(text, CRI_PLUGIN[version])
    try:
        added = _edit_runtime(doc, text, version, name, runtime_path, base_options)
        new = tomlkit.dumps(doc)
        if added is not None:
            new = _separate_block(new, version, name)
        new = ctoml.space_new_headers(text, new)
        if set_default:
            new = cdefault.set_default(new, version, name, q, source)
    except (TOMLKitError, AttributeError, TypeError, KeyError, ValueError):
        new = ""
    if not ctoml.parses_as(new, expected):
        # tomlkit 0.11 mishandles some layouts (tables declared out of order): fall back to
        # plain text edits, which the same check must accept.
        new = _text_configure(text, plain, version, name, runtime_path, base_options, source)
        if set_default:
            new = cdefault.set_default(new, version, name, q, source)
    ctoml.verify(new, expected, source)
    return Edit(new, True, notes + cdi_notes(plain, version))


def cdi_notes(plain: dict[str, Any], version: int) -> tuple[str, ...]:
    """What the CRI plugin's ``enable_cdi`` and ``cdi_spec_dirs`` mean for gpuhook (left as
    they are): with CDI on, containerd resolves ``cdi.k8s.io/*`` annotations itself and fails a
    container whose device no spec in those folders names."""
    plugin = ctoml.walk(plain, ("plugins", CRI_PLUGIN[version]), "") or {}
    enabled, dirs = cdi_settings(plugin, version)
    if not enabled:
        return ("CDI: enable_cdi is off; gpuhook-runtime reads the cdi.k8s.io/* annotations",)
    where = ", ".join(dirs) or "?"
    return (
        f"CDI: enable_cdi is on: containerd injects cdi.k8s.io/* devices from the specs in "
        f"{where}; gpuhook's spec (cdi.output, kept by gpuhook inventory refresh) must be in "
        "one of them (gpuhook doctor checks)",
    )


def _separate_block(text: str, version: int, name: str) -> str:
    """Lay out an added runtime block as ``<previous table>, one blank line, the block, then the
    blank lines that ended the previous table``: so removing the block and the one blank line
    before it gives back the file as it was."""
    lines = text.split("\n")
    own = ctoml.runtime_header_re(version, name)
    first = next((i for i, line in enumerate(lines) if own.match(line)), None)
    if first is None:
        return text
    last = first
    for i in range(first + 1, len(lines)):
        if ctoml.HEADER.match(lines[i]) and not own.match(lines[i]):
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


def _configure_notes(
    plain: dict[str, Any],
    version: int,
    name: str,
    runtime_path: str,
    set_default: bool,
    base: Mapping[str, Any] | None,
) -> tuple[str, ...]:
    notes: list[str] = []
    cri = ctoml.walk(plain, ctoml.cri_path(version), "") or {}
    runtimes = cri.get("runtimes") or {}
    wanted, origin = _wanted_runtime(runtimes, name, runtime_path, base)
    current = runtimes.get(name)
    if current is None:
        notes.append(f"added CRI runtime {name} ({RUNC_TYPE}, BinaryName {runtime_path}; {origin})")
    else:
        for key, value in wanted.items():
            if key != "options" and current.get(key) != value:
                notes.append(f"runtime {name}: {key} = {ctoml.toml_value(value, chr(34))}")
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


def _text_configure(
    text: str,
    plain: dict[str, Any],
    version: int,
    name: str,
    runtime_path: str,
    base: Mapping[str, Any] | None,
    source: str,
) -> str:
    """The same runtime edit as plain text: append the runtime table."""
    cri = ctoml.walk(plain, ctoml.cri_path(version), source) or {}
    runtimes = cri.get("runtimes") or {}
    if name in runtimes:
        raise RegistrationError(
            f"{source}: cannot update runtime {name} in this layout safely; nothing written "
            f"(remove it with `gpuhook runtime unconfigure` first)"
        )
    q = ctoml.quote(text, CRI_PLUGIN[version])
    wanted, _ = _wanted_runtime(runtimes, name, runtime_path, base)
    options = {k: v for k, v in wanted["options"].items() if k != "BinaryName"}
    items = [(ctoml.toml_key(k), ctoml.toml_value(v, q)) for k, v in options.items()]
    items.insert(0, ("BinaryName", ctoml.toml_string(runtime_path, q)))
    lines = text.rstrip("\n").split("\n")
    snippet = _runtime_snippet("", version, name, wanted, items)
    if q == "'":
        snippet = snippet.replace(f'"{CRI_PLUGIN[version]}"', f"'{CRI_PLUGIN[version]}'")
    return "\n".join(lines) + "\n\n" + snippet.rstrip("\n") + "\n"


def _text_unconfigure(text: str, version: int, name: str) -> str:
    """Remove the runtime's tables (and the one blank line before them) and give the default
    back to runc, as plain text: the inverse of the layout :func:`_separate_block` makes. Blank
    and comment lines at the end of a block stay: they introduce the next table."""
    lines = text.split("\n")
    own = ctoml.runtime_header_re(version, name)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if own.match(line):
            end = i
            j = i + 1
            while j < len(lines) and not (ctoml.HEADER.match(lines[j]) and not own.match(lines[j])):
                stripped = lines[j].strip()
                if stripped and not stripped.startswith("#"):
                    end = j
                j += 1
            if out and not out[-1].strip():
                out.pop()
            i = end + 1
            continue
        if not cdefault.unset_default(lines, i, name, out):
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
    version = ctoml.config_version(plain, source)
    ctoml.check_shape(plain, version, name, source)
    cri_keys = ctoml.cri_path(version)
    expected: dict[str, Any] = ctoml.plain(plain)
    notes: list[str] = []
    node = expected
    for key in cri_keys:
        node = node.get(key) or {}
    if name in (node.get("runtimes") or {}):
        del node["runtimes"][name]
        notes.append(f"removed CRI runtime {name}")
    if node.get("default_runtime_name") == name:
        present, back = cdefault.previous(text, name)
        if present:
            node["default_runtime_name"] = back
        else:
            del node["default_runtime_name"]
        notes.append(f"default runtime: {name} -> {back or RUNC}")
    if not notes:
        return Edit(text, False, ())
    new = _text_unconfigure(text, version, name)
    if ctoml.parses_as(new, expected):
        return Edit(new, True, tuple(notes))
    try:
        runtimes = ctoml.tk_table(doc, (*cri_keys, "runtimes"))
        if runtimes is not None and ctoml.tk_get(runtimes, name) is not None:
            del runtimes[name]
        cri = ctoml.tk_table(doc, cri_keys)
        if cri is not None and ctoml.tk_get(cri, "default_runtime_name") == name:
            quote = ctoml.quote(text, CRI_PLUGIN[version])
            present, back = cdefault.previous(text, name)
            if present:
                cri["default_runtime_name"] = ctoml.tk_string(back, quote)
            else:
                del cri["default_runtime_name"]
        new = tomlkit.dumps(doc)
    except (TOMLKitError, AttributeError, TypeError, KeyError, ValueError):
        new = ""
    ctoml.verify(new, expected, source)
    return Edit(new, True, tuple(notes))
