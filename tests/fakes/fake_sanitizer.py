#!/usr/bin/env python3
"""A stand-in for compute-sanitizer, for the sanitize suite's plumbing on a machine without a GPU:
it takes compute-sanitizer's options, runs the command after them (the worker, with its socket
passed on) and, when the command has exited, writes a report into ``--log-file`` the way the tool
does: the errors named by FAKE_SANITIZER_ERRORS (a count), then the summary. Under ``--tool
racecheck`` it writes races instead, FAKE_SANITIZER_ERRORS of them graded Error and
FAKE_SANITIZER_WARNINGS graded Warning, and racecheck's summary, which counts the two apart."""

import os
import subprocess
import sys

args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
tool = args[args.index("--tool") + 1]
command = args[args.index("-m") - 1:]
fd = int(command[command.index("--fd") + 1])
status = subprocess.run(command, pass_fds=(fd,)).returncode
errors = int(os.environ.get("FAKE_SANITIZER_ERRORS", "0"))
warnings = int(os.environ.get("FAKE_SANITIZER_WARNINGS", "0"))


def plural(count, noun):
    return f"{count} {noun}{'s' if count != 1 else ''}"


if tool == "racecheck":
    with open(log, "w") as out:
        out.write("========= COMPUTE-SANITIZER\n")
        for grade in ["Error"] * errors + ["Warning"] * warnings:
            out.write(f"========= {grade}: Race reported between Write access at attn_bwd_dq+0x1c0 in kernels.py:801\n"
                      "=========     and Read access at attn_bwd_dq+0x2a0 in kernels.py:812 [64 hazards]\n"
                      "=========\n")
        out.write(f"========= RACECHECK SUMMARY: {plural(errors + warnings, 'hazard')} displayed "
                  f"({plural(errors, 'error')}, {plural(warnings, 'warning')})\n")
    sys.exit(97 if errors else status)
with open(log, "w") as out:
    out.write(f"========= COMPUTE-SANITIZER\n")
    for index in range(errors):
        out.write("========= Invalid __global__ read of size 2 bytes\n"
                  f"=========     at attn_fwd+0x{0x1f0 + index:x} in kernels.py:{120 + index}\n"
                  "=========     by thread (32,0,0) in block (3,0,0)\n"
                  "=========     Address 0x7f0000001000 is out of bounds\n"
                  "=========     and is 2 bytes after the nearest allocation at 0x7f0000000000 of size 4096 bytes\n"
                  "=========     Saved host backtrace up to driver entry point at kernel launch time\n"
                  "=========         Host Frame: [0x2e4c1f] in libcuda.so.1\n"
                  "=========\n")
    out.write(f"========= ERROR SUMMARY: {errors} error{'s' if errors != 1 else ''}\n")
sys.exit(97 if errors else status)
