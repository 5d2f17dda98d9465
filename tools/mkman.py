#!/usr/bin/python3
"""Write gpuhook's manual page (roff, section 1) to stdout, generated from the click CLI itself.

    python3 tools/mkman.py > gpuhook.1

Every command and option of ``gpuhook`` comes from the click tree (so commands added later appear
without editing this file); the sections about gpuhook-runtime, the docker compatibility hook,
files, environment and exit status are written here. The date is $SOURCE_DATE_EPOCH when set
(dpkg-buildpackage sets it from debian/changelog), so the page is reproducible. Needs click and
gpuhook importable (the .deb build puts src/ on sys.path).
"""

from __future__ import annotations

import os
import sys
import time

import click

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from gpuhook import __version__
from gpuhook.cli.commands import main as cli


def esc(text: str) -> str:
    """Escape plain text for roff: backslashes, minus signs, and a leading control character."""
    out = []
    for line in text.replace("\\", "\\e").replace("-", "\\-").splitlines():
        out.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(out)


def paragraphs(text: str) -> str:
    """click help text (paragraphs separated by blank lines, \\b marks unwrapped blocks)."""
    blocks = []
    for raw in text.strip().split("\n\n"):
        block = raw.strip("\n")
        if block.startswith("\b"):
            blocks.append(".nf\n" + esc(block[1:].strip("\n")) + "\n.fi")
        else:
            blocks.append(esc(" ".join(block.split())))
    return "\n.PP\n".join(blocks)


def command_sections(cmd: click.Command, ctx: click.Context, out: list[str]) -> None:
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            command_sections(sub, click.Context(sub, info_name=name, parent=ctx), out)
        return
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    out.append(f'.SS "{esc(ctx.command_path)} {esc(usage)}"')
    out.append(paragraphs(cmd.help or cmd.short_help or ""))
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or not isinstance(param, click.Option) or param.name == "help":
            continue
        names, help_text = record
        out.append(".TP")
        out.append(f"\\fB{esc(names)}\\fR")
        out.append(esc(" ".join(help_text.split())) or "\\&")


PAGE_HEAD = r""".TH GPUHOOK 1 "{date}" "gpuhook {version}" "gpuhook manual"
.SH NAME
gpuhook, gpuhook\-runtime, nvidia\-container\-runtime\-hook \- GPU sharing runtime for containers
.SH SYNOPSIS
.B gpuhook
[\fB\-\-config\fR \fIPATH\fR] [\fB\-\-debug\fR] \fICOMMAND\fR [\fIARGS\fR]...
.br
.B gpuhook\-runtime
[\fIrunc global options\fR] \fIcommand\fR [\fIargs\fR]...
.br
.B gpuhook\-runtime \-\-version
.SH DESCRIPTION
gpuhook makes a GPU node safe to share between containers. It is registered as the default OCI
runtime of docker or containerd, so it sees every container created on the node. For each one it
decides, from trusted signals only, which GPUs the container may use, and rewrites the container's
OCI spec to inject exactly those device nodes, the host's driver libraries and binaries, and the
environment. A container that asked for no GPU gets none, even when its image sets
NVIDIA_VISIBLE_DEVICES=all.
.PP
.B gpuhook\-runtime
is argv\-compatible with
.BR runc (8).
On \fBcreate\fR and \fBrun\fR it reads \fIBUNDLE\fR/config.json, decides, writes the spec back
atomically when it changed, and executes runc (or crun) with the untouched arguments. Every other
command is passed to runc directly. A container with no GPU request is never blocked by gpuhook's
own faults; a GPU request that cannot be satisfied fails the create with one line naming the cause,
on stderr and in runc's \fB\-\-log\fR file. It is a small static program: a create whose spec
holds no GPU marker, and every other command, start no interpreter; a create with a marker is
decided by the runtime service (\fBgpuhook runtime serve\fR, gpuhook\-runtime.service) when it
listens on \fIruntime.service\fR, else by Python started for that create.
.PP
.B nvidia\-container\-runtime\-hook
exists so that \fBdocker run \-\-gpus\fR finds the prestart hook it expects. gpuhook\-runtime
serves the request itself and removes that hook from the spec, so it only runs (and fails with one
line) when a container was created by another runtime.
.PP
.B gpuhook
explains and manages those decisions. Its output is a table on a terminal and JSON otherwise,
unless \fB\-\-output\fR says. Every failure is one line on stderr.
.PP
The package does not register gpuhook with any container engine on its own. Register it with
\fBgpuhook runtime configure \-\-runtime docker \-\-set\-as\-default\fR (or
\fB\-\-runtime containerd\fR); see that command's \fB\-\-help\fR.
.SH OPTIONS
.TP
\fB\-\-config\fR \fIPATH\fR
Config file (default: $GPUHOOK_CONFIG, else /etc/gpuhook/config.yaml).
.TP
\fB\-\-debug\fR
Debug logging (same as GPUHOOK_DEBUG=1).
.TP
\fB\-\-version\fR
Print the version and exit.
.TP
\fB\-h\fR, \fB\-\-help\fR
Print a command's help and exit.
.SH COMMANDS"""

PAGE_TAIL = r""".SH ENVIRONMENT
.TP
.B GPUHOOK_CONFIG
The config file every gpuhook executable uses instead of /etc/gpuhook/config.yaml.
.TP
.B GPUHOOK_DEBUG
Set to 1 for debug logging in every executable.
.TP
.B GPUHOOK_CACHE_DIR
The folder of the compiled config caches and gpuhook\-runtime's pointers, instead of
/run/gpuhook/config (an absolute path; a second gpuhook beside the node's keeps its own).
.TP
.B NO_COLOR
Set to turn off colour in tables.
.SH FILES
.TP
.I /etc/gpuhook/config.yaml
gpuhook's configuration; every key and its default is documented in
/usr/share/doc/gpuhook/examples/config.yaml.example.
.TP
.I /var/lib/gpuhook/inventory.json
The node inventory (GPUs, MIG devices, driver files, device nodes), written by
\fBgpuhook inventory refresh\fR: at boot (gpuhook\-inventory.service), when the driver changes
(gpuhook\-inventory.path), or lazily when it is missing or stale.
.TP
.I /var/lib/gpuhook/containers/
One record per container with the decision and its reasons.
.TP
.I /var/log/gpuhook/gpuhook.log
JSON\-lines log of every executable.
.TP
.I /run/gpuhook/
The validated config cached for the container\-create path, and the runtime service's socket
(\fIruntime.sock\fR).
.SH EXIT STATUS
0 on success, 1 on a failure with a one\-line message, 2 for a bad command line or an invalid
config, 70 for an internal error (please report it), 130 when interrupted.
gpuhook\-runtime exits with runc's status once it has handed over.
.SH SEE ALSO
.BR runc (8),
.BR dockerd (8),
.BR containerd (8),
.BR systemd.path (5)
"""


def page() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    date = time.strftime("%Y-%m-%d", time.gmtime(int(epoch) if epoch else None))
    out = [PAGE_HEAD.format(date=date, version=__version__)]
    root = click.Context(cli, info_name="gpuhook")
    command_sections(cli, root, out)
    out.append(PAGE_TAIL)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(page())
