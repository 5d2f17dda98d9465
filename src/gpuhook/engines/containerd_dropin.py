"""containerd drop-in files (pure): ``gpuhook runtime configure --drop-in`` keeps gpuhook's
runtime in its own file that the main ``config.toml`` imports. containerd 1.x replaces a whole
plugin section with an imported one (containerd/containerd#5837), so a version-2 drop-in starts
from a copy of the main file's CRI section; containerd 2.x merges imports key by key, so a
version-3 drop-in holds only gpuhook's keys."""

from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING, Any

import tomlkit

from gpuhook.engines import containerd_toml as ctoml
from gpuhook.engines.common import (
    DEFAULT_NAME,
    DEFAULT_RUNTIME_PATH,
    Edit,
    check_name,
    toml_load,
)
from gpuhook.engines.containerd import containerd_configure, new_containerd_text
from gpuhook.engines.containerd_default import ADDED
from gpuhook.engines.readers import CRI_PLUGIN
from gpuhook.errors import RegistrationError

if TYPE_CHECKING:
    from collections.abc import Mapping


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
    ctoml.config_version(plain, source)
    imports = imports_of(plain, source)
    if _imported(imports, dropin_path):
        return Edit(text, False, (f"{dropin_path} is already imported",))
    expected = ctoml.plain(plain)
    expected["imports"] = [*imports, dropin_path]
    current = ctoml.tk_get(doc, "imports")
    if current is None:  # one line after `version`, marked: undo removes the key it added
        line = f"imports = [{ctoml.toml_string(dropin_path, chr(34))}]  {ADDED}"
        new = re.sub(
            r"(?m)^(version\s*=[^\n]*)(?:\n|\Z)",
            lambda m: f"{m.group(1)}\n{line}\n",
            text,
            count=1,
        )
    else:
        current.append(dropin_path)
        new = tomlkit.dumps(doc)
    ctoml.verify(new, expected, source)
    return Edit(new, True, (f"imports += {dropin_path}",))


def containerd_remove_import(text: str, dropin_path: str, *, source: str = "config.toml") -> Edit:
    doc, plain = toml_load(text, source)
    ctoml.config_version(plain, source)
    imports = imports_of(plain, source)
    if dropin_path not in imports:
        return Edit(text, False, ())
    expected = ctoml.plain(plain)
    expected["imports"] = [i for i in imports if i != dropin_path]
    current: Any = doc["imports"]
    while dropin_path in list(current):
        current.remove(dropin_path)
    new = tomlkit.dumps(doc)
    if not expected["imports"]:  # a key configure added (its mark) goes with its last entry
        dropped = re.sub(rf"(?m)^imports\s*=\s*\[\s*\]\s*{re.escape(ADDED)}\n", "", new)
        if dropped != new:
            del expected["imports"]
            new = dropped
    ctoml.verify(new, expected, source)
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
    base_options: Mapping[str, Any] | None = None,
) -> tuple[Edit, Edit]:
    """(main config edit, drop-in edit). The drop-in is written at the main file's config
    version (containerd refuses a drop-in of a higher version than the root file's). The drop-in
    of a version-2 config starts from a copy of the main file's CRI section (containerd 1.x
    replaces whole plugin sections on import); one of version 3 or 4 holds only gpuhook's keys,
    its runtime carrying ``base_options``, runc's options in the merged config."""
    check_name(name)
    main = main_text if main_text and main_text.strip() else new_containerd_text(new_version)
    _doc, plain = toml_load(main, source)
    version = ctoml.config_version(plain, source)
    ctoml.check_shape(plain, version, name, source)
    if dropin_text and dropin_text.strip():
        _d, dplain = toml_load(dropin_text, dropin_source)
        if ctoml.config_version(dplain, dropin_source) != version:
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
        base_options=base_options,
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
    if version == 2 and ctoml.walk(plain, ("plugins", CRI_PLUGIN[2]), source) is not None:
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
