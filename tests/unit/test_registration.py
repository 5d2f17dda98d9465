"""Registration edits (pure): docker daemon.json and containerd config.toml v2/v3, on real-world
samples. Every test reads the result back as a plain parser would (json, tomllib) and checks
that the rest of the user's file survives byte for byte."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpuhook.engines import registration as r
from gpuhook.errors import RegistrationError

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "registration"
DAEMON = (SAMPLES / "daemon.json").read_text()
V2 = (SAMPLES / "containerd-1.6-default.toml").read_text()
V3 = (SAMPLES / "containerd-2.0-v3.toml").read_text()
RT = "/usr/bin/gpuhook-runtime"
CRI2 = ("plugins", "io.containerd.grpc.v1.cri", "containerd")
CRI3 = ("plugins", "io.containerd.cri.v1.runtime", "containerd")


def at(data: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        data = data[key]
    return data


def removed_lines(before: str, after: str) -> list[str]:
    """Lines of ``before`` that ``after`` lost or changed (a unified diff's '-' lines)."""
    diff = r.unified_diff(before, after, "f").splitlines()
    return [line[1:] for line in diff[2:] if line.startswith("-")]


def added_lines(before: str, after: str) -> list[str]:
    diff = r.unified_diff(before, after, "f").splitlines()
    return [line[1:] for line in diff[2:] if line.startswith("+")]


# --- docker ---------------------------------------------------------------------------------


def test_docker_configure_keeps_every_other_key_its_order_and_its_text() -> None:
    edit = r.docker_configure(DAEMON, set_default=True, source="/etc/docker/daemon.json")
    assert edit.changed
    data = json.loads(edit.text)
    before = json.loads(DAEMON)
    assert list(data) == [*before, "default-runtime"]
    assert data["runtimes"] == {"crun": {"path": "/usr/bin/crun"}, "gpuhook": {"path": RT}}
    assert data["default-runtime"] == "gpuhook"
    assert {k: v for k, v in data.items() if k not in ("runtimes", "default-runtime")} == {
        k: v for k, v in before.items() if k != "runtimes"
    }
    # Only the lines around the insertions change: every other line is the user's own text.
    assert removed_lines(DAEMON, edit.text) == [
        '        "crun": {"path": "/usr/bin/crun"}',
        '    "max-concurrent-downloads": 6',
    ]
    assert added_lines(DAEMON, edit.text) == [
        '        "crun": {"path": "/usr/bin/crun"},',
        '        "gpuhook": {',
        f'            "path": "{RT}"',
        "        }",
        '    "max-concurrent-downloads": 6,',
        '    "default-runtime": "gpuhook"',
    ]
    assert edit.notes == (f"added runtime gpuhook -> {RT}", "default runtime: runc -> gpuhook")


def test_docker_configure_twice_changes_nothing() -> None:
    first = r.docker_configure(DAEMON, set_default=True)
    second = r.docker_configure(first.text, set_default=True)
    assert not second.changed and second.text == first.text and second.notes == ()


def test_docker_without_default_leaves_the_default_and_says_so() -> None:
    edit = r.docker_configure(DAEMON)
    assert "default-runtime" not in json.loads(edit.text)
    assert edit.notes[-1].startswith("the default runtime stays runc:")


def test_docker_replaces_another_default_and_updates_a_stale_path() -> None:
    text = json.dumps(
        {
            "default-runtime": "nvidia",
            "runtimes": {"gpuhook": {"path": "/opt/old", "runtimeArgs": ["--debug"]}},
        },
        indent=4,
    )
    edit = r.docker_configure(text, set_default=True, runtime_path=RT)
    data = json.loads(edit.text)
    assert data == {
        "default-runtime": "gpuhook",
        "runtimes": {"gpuhook": {"path": RT, "runtimeArgs": ["--debug"]}},
    }
    assert edit.notes == (
        f"runtime gpuhook: path set to {RT}",
        "default runtime: nvidia -> gpuhook",
    )


@pytest.mark.parametrize("text", [None, "", "  \n"])
def test_docker_new_file(text: str | None) -> None:
    edit = r.docker_configure(text, set_default=True, name="gh", runtime_path="/x/gpuhook-runtime")
    assert edit.changed
    assert edit.text == (
        '{\n  "runtimes": {\n    "gh": {\n      "path": "/x/gpuhook-runtime"\n    }\n  },\n'
        '  "default-runtime": "gh"\n}\n'
    )


def test_docker_keeps_tab_indentation_and_one_line_objects() -> None:
    tabbed = '{\n\t"debug": true,\n\t"runtimes": {}\n}\n'
    assert r.docker_configure(tabbed).text == (
        '{\n\t"debug": true,\n\t"runtimes": {\n\t\t"gpuhook": {\n\t\t\t"path": '
        f'"{RT}"\n\t\t}}\n\t}}\n}}\n'
    )
    one_line = '{"debug": true, "runtimes": {"crun": {"path": "/usr/bin/crun"}}}'
    assert r.docker_configure(one_line, set_default=True).text == (
        '{"debug": true, "runtimes": {"crun": {"path": "/usr/bin/crun"}, '
        f'"gpuhook": {{"path": "{RT}"}}}}, "default-runtime": "gpuhook"}}'
    )


def test_docker_unconfigure_restores_the_original_text() -> None:
    configured = r.docker_configure(DAEMON, set_default=True).text
    edit = r.docker_unconfigure(configured)
    assert edit.changed and edit.text == DAEMON
    assert edit.notes == ("removed runtime gpuhook", "default runtime: gpuhook -> runc")
    assert not r.docker_unconfigure(edit.text).changed


def test_docker_unconfigure_leaves_another_default_alone() -> None:
    text = (
        '{"default-runtime": "crun", '
        '"runtimes": {"gpuhook": {"path": "/a"}, "crun": {"path": "/b"}}}'
    )
    data = json.loads(r.docker_unconfigure(text).text)
    assert data == {"default-runtime": "crun", "runtimes": {"crun": {"path": "/b"}}}


def test_docker_unconfigure_drops_a_runtimes_key_it_emptied() -> None:
    configured = r.docker_configure('{\n  "debug": true\n}\n', set_default=True).text
    assert r.docker_unconfigure(configured).text == '{\n  "debug": true\n}\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"debug": true,', "malformed JSON: Expecting property name enclosed in double quotes"),
        ("[1, 2]", "the top level must be a JSON object, not an array"),
        ('{"runtimes": "runc"}', "runtimes: must be an object, not a string"),
        ('{"runtimes": {"x": ["/bin/x"]}}', "runtimes.x: must be an object, not an array"),
        ('{"default-runtime": 1}', "default-runtime: must be a string, not a number"),
        ('{"debug": true, "debug": false}', "malformed JSON: duplicate key 'debug'"),
    ],
)
def test_docker_malformed_is_refused_with_one_line(text: str, message: str) -> None:
    for edit in (r.docker_configure, r.docker_unconfigure):
        with pytest.raises(RegistrationError) as info:
            edit(text, source="/etc/docker/daemon.json")
        line = str(info.value)
        assert line.startswith(f"/etc/docker/daemon.json: {message}"), line
        assert "\n" not in line


@pytest.mark.parametrize("name", ["runc", "io.containerd.runc.v2", "my runtime", "", "../x"])
def test_bad_runtime_names(name: str) -> None:
    with pytest.raises(RegistrationError, match="runtime name"):
        r.docker_configure("{}", name=name)
    with pytest.raises(RegistrationError, match="runtime name"):
        r.containerd_configure(V2, name=name)


# --- containerd, config version 2 (containerd 1.x) ---------------------------------------------


def test_containerd_v2_default_config() -> None:
    edit = r.containerd_configure(V2, set_default=True, source="/etc/containerd/config.toml")
    assert edit.changed
    assert removed_lines(V2, edit.text) == ['      default_runtime_name = "runc"']
    added = added_lines(V2, edit.text)
    assert added[0] == '      default_runtime_name = "gpuhook"'
    options = [
        f'            BinaryName = "{RT}"',
        '            CriuImagePath = ""',
        '            CriuPath = ""',
        '            CriuWorkPath = ""',
        "            IoGid = 0",
        "            IoUid = 0",
        "            NoNewKeyring = false",
        "            NoPivotRoot = false",
        '            Root = ""',
        '            ShimCgroup = ""',
        "            SystemdCgroup = false",
    ]
    assert added[1:] == [
        '        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook]',
        '          runtime_type = "io.containerd.runc.v2"',
        '          container_annotations = ["cdi.k8s.io/*"]',
        '          pod_annotations = ["gpuhook.io/*"]',
        "",
        '          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook.options]',
        *options,
        "",
    ]
    # Placed right after the runc runtime, before the next table.
    runc_end = edit.text.index('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook]')
    assert edit.text.index("containerd.runtimes.runc.options]") < runc_end
    assert runc_end < edit.text.index("containerd.untrusted_workload_runtime]")
    data = tomllib.loads(edit.text)
    assert at(data, *CRI2, "default_runtime_name") == "gpuhook"
    runtime = at(data, *CRI2, "runtimes", "gpuhook")
    assert runtime["runtime_type"] == "io.containerd.runc.v2"
    assert runtime["options"] == {
        **at(data, *CRI2, "runtimes", "runc", "options"),
        "BinaryName": RT,
    }


def test_containerd_copies_systemd_cgroup_from_runc() -> None:
    text = V2.replace("SystemdCgroup = false", "SystemdCgroup = true")
    data = tomllib.loads(r.containerd_configure(text).text)
    assert at(data, *CRI2, "runtimes", "gpuhook", "options", "SystemdCgroup") is True
    assert at(data, *CRI2, "default_runtime_name") == "runc"


def test_containerd_copies_runc_options_of_any_toml_type() -> None:
    """A TOML date-time among runc's options is copied as a date-time (not refused, not text)."""
    text = V2.replace(
        "SystemdCgroup = false", "SystemdCgroup = false\n            Since = 1979-05-27T07:32:00Z"
    )
    data = tomllib.loads(r.containerd_configure(text).text)
    options = at(data, *CRI2, "runtimes", "gpuhook", "options")
    assert options["Since"] == at(data, *CRI2, "runtimes", "runc", "options", "Since")
    assert not isinstance(options["Since"], str)


def test_containerd_twice_changes_nothing_and_unconfigure_restores_the_file() -> None:
    for sample in (V2, V3):
        first = r.containerd_configure(sample, set_default=True)
        second = r.containerd_configure(first.text, set_default=True)
        assert not second.changed and second.text == first.text and second.notes == ()
        undone = r.containerd_unconfigure(first.text)
        assert undone.text == sample
        assert undone.notes == ("removed CRI runtime gpuhook", "default runtime: gpuhook -> runc")
        assert not r.containerd_unconfigure(undone.text).changed


def test_containerd_without_default() -> None:
    edit = r.containerd_configure(V2)
    assert at(tomllib.loads(edit.text), *CRI2, "default_runtime_name") == "runc"
    assert edit.notes[-2].startswith("the default runtime stays runc:")
    assert edit.notes[-1] == (
        "CDI: enable_cdi is off; gpuhook-runtime reads the cdi.k8s.io/* annotations"
    )
    undone = r.containerd_unconfigure(edit.text)
    assert undone.text == V2 and undone.notes == ("removed CRI runtime gpuhook",)


def test_containerd_comments_and_layout_survive() -> None:
    text = (
        "# /etc/containerd/config.toml, managed by hand\n"
        "version = 2\n"
        'root = "/srv/containerd"  # big disk\n'
        "\n"
        "[plugins]\n"
        '  # the CRI plugin\n  [plugins."io.containerd.grpc.v1.cri"]\n'
        '    sandbox_image = "registry.k8s.io/pause:3.9"\n'
        '    [plugins."io.containerd.grpc.v1.cri".containerd]\n'
        '      default_runtime_name = "runc"  # change with care\n'
        '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        '        runtime_type = "io.containerd.runc.v2"\n'
        '        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "          SystemdCgroup = true  # systemd host\n"
        '  [plugins."io.containerd.grpc.v1.cri".registry]\n'
        '    config_path = "/etc/containerd/certs.d"\n'
    )
    edit = r.containerd_configure(text, set_default=True)
    assert removed_lines(text, edit.text) == [
        '      default_runtime_name = "runc"  # change with care'
    ]
    assert '      default_runtime_name = "gpuhook"  # change with care' in edit.text.splitlines()
    assert "          SystemdCgroup = true  # systemd host" in edit.text.splitlines()
    data = tomllib.loads(edit.text)
    assert at(data, *CRI2, "runtimes", "gpuhook", "options") == {
        "BinaryName": RT,
        "SystemdCgroup": True,
    }
    assert at(data, "plugins", "io.containerd.grpc.v1.cri", "registry") == {
        "config_path": "/etc/containerd/certs.d"
    }
    assert r.containerd_unconfigure(edit.text).text == text


def test_containerd_tables_declared_out_of_order() -> None:
    text = (
        "version = 2\n"
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        '[plugins."io.containerd.grpc.v1.cri".cni]\n'
        '  bin_dir = "/opt/cni/bin"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd]\n'
        '  snapshotter = "overlayfs"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "  SystemdCgroup = true\n"
    )
    edit = r.containerd_configure(text, set_default=True)
    data = tomllib.loads(edit.text)
    assert at(data, *CRI2, "default_runtime_name") == "gpuhook"
    assert at(data, *CRI2, "snapshotter") == "overlayfs"
    assert at(data, *CRI2, "runtimes", "gpuhook", "options") == {
        "BinaryName": RT,
        "SystemdCgroup": True,
    }
    assert not removed_lines(text, edit.text)
    assert not r.containerd_configure(edit.text, set_default=True).changed
    undone = r.containerd_unconfigure(edit.text)
    assert undone.text == text  # no default_runtime_name before: none after
    assert undone.notes == ("removed CRI runtime gpuhook", "default runtime: gpuhook -> runc")


def test_containerd_updates_an_existing_gpuhook_runtime_in_place() -> None:
    text = (
        "version = 2\n"
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        '  pod_annotations = ["example.com/*"]\n'
        "  privileged_without_host_devices = true\n"
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gpuhook.options]\n'
        '  BinaryName = "/opt/old/gpuhook-runtime"\n'
        "  SystemdCgroup = true\n"
    )
    edit = r.containerd_configure(text)
    runtime = at(tomllib.loads(edit.text), *CRI2, "runtimes", "gpuhook")
    assert runtime == {
        "runtime_type": "io.containerd.runc.v2",
        "pod_annotations": ["example.com/*", "gpuhook.io/*"],
        "privileged_without_host_devices": True,
        "container_annotations": ["cdi.k8s.io/*"],
        "options": {"BinaryName": RT, "SystemdCgroup": True},
    }
    assert "runtime gpuhook: BinaryName = /usr/bin/gpuhook-runtime" in edit.notes


@pytest.mark.parametrize(("version", "cri"), [(2, CRI2), (3, CRI3)])
def test_containerd_new_file(version: int, cri: tuple[str, ...]) -> None:
    edit = r.containerd_configure(None, set_default=True, new_version=version)
    data = tomllib.loads(edit.text)
    assert data == {
        "version": version,
        "plugins": {
            cri[1]: {
                "containerd": {
                    "default_runtime_name": "gpuhook",
                    "runtimes": {
                        "gpuhook": {
                            "runtime_type": "io.containerd.runc.v2",
                            "container_annotations": ["cdi.k8s.io/*"],
                            "pod_annotations": ["gpuhook.io/*"],
                            "options": {"BinaryName": RT},
                        }
                    },
                }
            }
        },
    }
    assert edit.text.endswith("\n") and not edit.text.endswith("\n\n")


# --- containerd, config version 3 (containerd 2.x) ---------------------------------------------


def test_containerd_v3_uses_the_cri_runtime_plugin_and_the_files_quotes() -> None:
    edit = r.containerd_configure(V3, set_default=True)
    assert removed_lines(V3, edit.text) == ["      default_runtime_name = 'runc'"]
    added = added_lines(V3, edit.text)
    assert added[:5] == [
        "      default_runtime_name = 'gpuhook'",
        "        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpuhook]",
        "          runtime_type = 'io.containerd.runc.v2'",
        "          container_annotations = ['cdi.k8s.io/*']",
        "          pod_annotations = ['gpuhook.io/*']",
    ]
    data = tomllib.loads(edit.text)
    assert at(data, *CRI3, "default_runtime_name") == "gpuhook"
    options = at(data, *CRI3, "runtimes", "gpuhook", "options")
    assert options["BinaryName"] == RT and options["SystemdCgroup"] is True
    assert "io.containerd.grpc.v1.cri" not in data["plugins"]


# --- containerd: refusals -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version = 2\n[plugins\n", "malformed TOML:"),
        ('[plugins.cri]\nsandbox_image = "x"\n', "no 'version = 2' (containerd 1.x) or"),
        ("version = 1\n", "version: config version 1 is not supported (2, 3 or 4)"),
        ('version = "2"\n', "version: config version '2' is not supported"),
        ("version = 2\nplugins = 1\n", "plugins: must be a table"),
        (
            'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\ncontainerd = []\n',
            'plugins."io.containerd.grpc.v1.cri".containerd: must be a table',
        ),
        (
            'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
            "default_runtime_name = 3\n",
            'plugins."io.containerd.grpc.v1.cri".containerd.default_runtime_name: must be a string',
        ),
    ],
)
def test_containerd_malformed_is_refused_with_one_line(text: str, message: str) -> None:
    for edit in (r.containerd_configure, r.containerd_unconfigure):
        with pytest.raises(RegistrationError) as info:
            edit(text, source="/etc/containerd/config.toml")
        line = str(info.value)
        assert line.startswith(f"/etc/containerd/config.toml: {message}"), line
        assert "\n" not in line


# --- containerd: drop-in files ------------------------------------------------------------------

DROPIN = "/etc/containerd/conf.d/gpuhook.toml"


def test_dropin_v2_carries_the_cri_section_and_the_main_file_only_imports_it() -> None:
    text = V2.replace("SystemdCgroup = false", "SystemdCgroup = true")
    main, dropin = r.containerd_dropin(text, None, set_default=True, dropin_source=DROPIN)
    assert removed_lines(text, main.text) == ["imports = []"]
    assert added_lines(text, main.text) == [f'imports = ["{DROPIN}"]']
    assert dropin.changed
    got = tomllib.loads(dropin.text)
    assert set(got) == {"version", "plugins"} and got["version"] == 2
    assert list(got["plugins"]) == ["io.containerd.grpc.v1.cri"]
    # containerd 1.x replaces the whole CRI section with the imported one: so the drop-in is the
    # main file's section plus gpuhook's runtime and default.
    want = json.loads(json.dumps(at(tomllib.loads(text), "plugins", "io.containerd.grpc.v1.cri")))
    want["containerd"]["default_runtime_name"] = "gpuhook"
    want["containerd"]["runtimes"]["gpuhook"] = {
        "runtime_type": "io.containerd.runc.v2",
        "container_annotations": ["cdi.k8s.io/*"],
        "pod_annotations": ["gpuhook.io/*"],
        "options": {**want["containerd"]["runtimes"]["runc"]["options"], "BinaryName": RT},
    }
    assert got["plugins"]["io.containerd.grpc.v1.cri"] == want
    again_main, again_dropin = r.containerd_dropin(
        main.text, dropin.text, set_default=True, dropin_source=DROPIN
    )
    assert not again_main.changed and not again_dropin.changed
    removed = r.containerd_remove_import(main.text, DROPIN)
    assert removed.text == text


def test_dropin_v3_holds_only_gpuhooks_keys() -> None:
    main, dropin = r.containerd_dropin(V3, None, set_default=True, dropin_source=DROPIN)
    assert added_lines(V3, main.text) == [f'imports = ["{DROPIN}"]']
    assert tomllib.loads(dropin.text) == {
        "version": 3,
        "plugins": {
            "io.containerd.cri.v1.runtime": {
                "containerd": {
                    "default_runtime_name": "gpuhook",
                    "runtimes": {
                        "gpuhook": {
                            "runtime_type": "io.containerd.runc.v2",
                            "container_annotations": ["cdi.k8s.io/*"],
                            "pod_annotations": ["gpuhook.io/*"],
                            "options": {"BinaryName": RT},
                        }
                    },
                }
            }
        },
    }


def test_dropin_already_covered_by_a_glob_import() -> None:
    text = "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n"
    main, _ = r.containerd_dropin(text, None, dropin_source=DROPIN)
    assert not main.changed and main.text == text


def test_dropin_version_must_match_the_main_file() -> None:
    with pytest.raises(RegistrationError, match="config version differs"):
        r.containerd_dropin(V3, "version = 2\n", dropin_source=DROPIN)


def test_unified_diff_names_the_file() -> None:
    diff = r.unified_diff("a\n", "b\n", "/etc/x")
    assert diff.splitlines() == [
        "--- /etc/x (now)",
        "+++ /etc/x (gpuhook)",
        "@@ -1 +1 @@",
        "-a",
        "+b",
    ]
    assert r.unified_diff("", "b\n", "/etc/x").startswith("--- /dev/null\n")


def test_the_example_daemon_json_is_what_configure_writes() -> None:
    example = Path(__file__).resolve().parents[2] / "config" / "daemon.json.example"
    assert r.docker_configure(None, set_default=True).text == example.read_text()


def test_containerd_v3_notes_say_where_cdi_specs_must_be() -> None:
    edit = r.containerd_configure(V3, set_default=True)
    assert edit.notes[-1] == (
        "CDI: enable_cdi is on: containerd injects cdi.k8s.io/* devices from the specs in "
        "/etc/cdi, /var/run/cdi; gpuhook's spec (cdi.output, kept by gpuhook inventory refresh) "
        "must be in one of them (gpuhook doctor checks)"
    )
    header = "[plugins.'io.containerd.cri.v1.runtime']\n"
    assert header in V3
    custom = V3.replace(header, header + "  cdi_spec_dirs = ['/srv/cdi']\n", 1)
    edit = r.containerd_configure(custom, set_default=True)
    assert "from the specs in /srv/cdi;" in edit.notes[-1]
    data = tomllib.loads(edit.text)
    assert data["plugins"]["io.containerd.cri.v1.runtime"]["cdi_spec_dirs"] == ["/srv/cdi"]
    off = custom.replace("cdi_spec_dirs = ['/srv/cdi']", "enable_cdi = false")
    assert r.containerd_configure(off).notes[-1].startswith("CDI: enable_cdi is off")


# --- containerd 2.3 (config version 4) and undo byte for byte -------------------------------

V4 = (SAMPLES / "containerd-2.3.4-default.toml").read_text()  # `containerd config default`, 2.3.4


def test_containerd_v4_default_config_of_2_3_4() -> None:
    edit = r.containerd_configure(V4, set_default=True)
    assert removed_lines(V4, edit.text) == ["      default_runtime_name = 'runc'"]
    data = tomllib.loads(edit.text)
    assert at(data, *CRI3, "default_runtime_name") == "gpuhook"
    runtime = at(data, *CRI3, "runtimes", "gpuhook")
    assert runtime["runtime_type"] == "io.containerd.runc.v2"
    assert runtime["options"] == {
        **at(data, *CRI3, "runtimes", "runc", "options"),
        "BinaryName": RT,
    }
    assert r.containerd_unconfigure(edit.text).text == V4


@pytest.mark.parametrize("sample", [V2, V3, V4])
def test_containerd_undo_restores_a_file_without_default_runtime_name(sample: str) -> None:
    """containerd's default is runc when the key is absent; undo leaves it absent."""
    text = "\n".join(line for line in sample.split("\n") if "default_runtime_name" not in line)
    edit = r.containerd_configure(text, set_default=True)
    data = tomllib.loads(edit.text)
    cri = CRI2 if sample is V2 else CRI3
    assert at(data, *cri, "default_runtime_name") == "gpuhook"
    [line] = [x for x in added_lines(text, edit.text) if "default_runtime_name" in x]
    assert line.endswith(
        "default_runtime_name = "
        + ('"gpuhook"' if cri == CRI2 else "'gpuhook'")
        + "  # gpuhook runtime configure: added"
    )
    undone = r.containerd_unconfigure(edit.text)
    assert undone.text == text
    assert undone.notes == ("removed CRI runtime gpuhook", "default runtime: gpuhook -> runc")


def test_containerd_undo_gives_back_another_default_runtime() -> None:
    text = V3.replace("default_runtime_name = 'runc'", "default_runtime_name = 'crun'")
    edit = r.containerd_configure(text, set_default=True)
    assert removed_lines(text, edit.text) == ["      default_runtime_name = 'crun'"]
    assert (
        "      default_runtime_name = 'gpuhook'  # gpuhook runtime configure: was 'crun'"
        in edit.text.splitlines()
    )
    undone = r.containerd_unconfigure(edit.text)
    assert undone.text == text
    assert undone.notes[-1] == "default runtime: gpuhook -> crun"


def test_containerd_undo_of_a_default_table_it_added() -> None:
    text = (
        "version = 3\n"
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n"
        "  SystemdCgroup = true\n"
    )
    edit = r.containerd_configure(text, set_default=True)
    mark = "  # gpuhook runtime configure: added"
    assert edit.text.endswith(
        f"\n[plugins.'io.containerd.cri.v1.runtime'.containerd]{mark}\n"
        f"  default_runtime_name = 'gpuhook'{mark}\n"
    )
    assert r.containerd_unconfigure(edit.text).text == text


def test_containerd_base_options_of_the_merged_config_win() -> None:
    """runc's options as `containerd config dump` shows them (a drop-in may set them) win over
    the file's; zero values the file does not list stay out, SystemdCgroup always in."""
    base = {"SystemdCgroup": False, "Root": "/srv/runc", "CriuPath": "", "IoUid": 0}
    edit = r.containerd_configure(V3, set_default=True, base_options=base)
    options = at(tomllib.loads(edit.text), *CRI3, "runtimes", "gpuhook", "options")
    assert options["SystemdCgroup"] is False and options["Root"] == "/srv/runc"
    assert "CriuPath" not in options and options["IoUid"] == 0  # IoUid: listed by the file
    _main, dropin = r.containerd_dropin(
        V3, None, set_default=True, dropin_source=DROPIN, base_options=base
    )
    options = at(tomllib.loads(dropin.text), *CRI3, "runtimes", "gpuhook", "options")
    assert options == {"BinaryName": RT, "SystemdCgroup": False, "Root": "/srv/runc"}


def test_dropin_undo_removes_an_imports_key_it_added() -> None:
    text = V3.replace("imports = []\n", "")
    main, _ = r.containerd_dropin(text, None, set_default=True, dropin_source=DROPIN)
    assert added_lines(text, main.text) == [
        f'imports = ["{DROPIN}"]  # gpuhook runtime configure: added'
    ]
    assert r.containerd_remove_import(main.text, DROPIN).text == text
