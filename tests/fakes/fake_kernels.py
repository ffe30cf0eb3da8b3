"""Attention implementations for the plugin's own tests, each correct except for the one rule it
breaks. ``fake_dist`` (tests/conftest.py) copies this file into a fake distribution; it is never
imported by the pytest process that runs the project's tests.
"""

import math, os, time, ctypes, subprocess, sys
import torch
from pytest_attnkit import AttentionImpl
from pytest_attnkit.oracle import attention_math

if os.environ.get("ATTNKIT_TEST_PIDS"):  # each worker that imports this says so, for "no worker left behind"
    open(os.path.join(os.environ["ATTNKIT_TEST_PIDS"], str(os.getpid())), "w").close()


def good(q, k, v, *, causal=False, scale=None):
    """Plain attention computed in float32: correct within the rule for every case."""
    out = attention_math(q.float(), k.float(), v.float(), causal=causal, scale=scale)
    return out.to(q.dtype)


def repeated(q, k, v, *, causal=False, scale=None):
    """Correct, and as slow as ATTNKIT_TEST_REPEAT times the work: real extra work for the gate."""
    for _ in range(int(os.environ.get("ATTNKIT_TEST_REPEAT", "1"))):
        out = good(q, k, v, causal=causal, scale=scale)
    return out


def sleeps(q, k, v, *, causal=False, scale=None):
    """Correct, after sleeping ATTNKIT_TEST_SLEEP_MS milliseconds: a time that load on the machine
    can only lengthen by a scheduler's wake-up, where work's time grows with every other process.
    Its work runs on one thread: torch's threads wait on each other whenever the scheduler keeps one
    off its core, and a 256-token call then took 50 ms beside two busy processes on two cores."""
    torch.set_num_threads(1)
    time.sleep(float(os.environ.get("ATTNKIT_TEST_SLEEP_MS", "0")) / 1000)
    return good(q, k, v, causal=causal, scale=scale)


def wrong_scale(q, k, v, *, causal=False, scale=None):
    return good(q * 1.05, k, v, causal=causal, scale=scale)


def top_left_causal(q, k, v, *, causal=False, scale=None):
    """Aligns the causal mask top-left (torch's is_causal) instead of bottom-right."""
    if causal and q.shape[-2] != k.shape[-2]:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        kk = k.float().repeat_interleave(q.shape[1] // k.shape[1], 1)
        vv = v.float().repeat_interleave(q.shape[1] // v.shape[1], 1)
        s = (q.float() @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return (s.masked_fill(~mask, -math.inf).softmax(-1) @ vv).to(q.dtype)
    return good(q, k, v, causal=causal, scale=scale)


def gqa_modulo(q, k, v, *, causal=False, scale=None):
    """Maps query head h to kv head h % Hkv instead of h // group."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat(1, group, 1, 1)
        v = v.repeat(1, group, 1, 1)
    return good(q, k, v, causal=causal, scale=scale)


def half_written(q, k, v, *, causal=False, scale=None):
    """Leaves the second half of the query rows unwritten."""
    right = good(q, k, v, causal=causal, scale=scale)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    rows = max(1, q.shape[-2] // 2)
    with torch.no_grad():
        out[..., :rows, :] = right[..., :rows, :]
    return out


def nan_output(q, k, v, *, causal=False, scale=None):
    out = good(q, k, v, causal=causal, scale=scale).clone()
    out.view(-1)[-1] = float("nan")
    return out


def modifies_input(q, k, v, *, causal=False, scale=None):
    out = good(q, k, v, causal=causal, scale=scale)
    with torch.no_grad():
        k.view(-1)[0] += 1.0 if k.is_contiguous() else 0.0
        k[0, 0, 0, 0] += 1.0
    return out


def wrong_shape(q, k, v, *, causal=False, scale=None):
    return good(q, k, v, causal=causal, scale=scale)[..., :-1]


def wrong_dtype(q, k, v, *, causal=False, scale=None):
    return good(q, k, v, causal=causal, scale=scale).float()


def wrong_device(q, k, v, *, causal=False, scale=None):
    return good(q, k, v, causal=causal, scale=scale).to("meta")


def not_a_tensor(q, k, v, *, causal=False, scale=None):
    return good(q, k, v, causal=causal, scale=scale).tolist()


class _ScaledGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.1


def wrong_grad(q, k, v, *, causal=False, scale=None):
    """Right output, gradients 10% too large."""
    return good(q, k, _ScaledGrad.apply(v), causal=causal, scale=scale)


def detached(q, k, v, *, causal=False, scale=None):
    with torch.no_grad():
        return good(q, k, v, causal=causal, scale=scale)


def raises(q, k, v, *, causal=False, scale=None):
    raise RuntimeError("kernel launch failed: too many resources requested")


def _launch(q):
    raise RuntimeError("kernel launch failed: too many resources requested")


def raises_in_helper(q, k, v, *, causal=False, scale=None):
    """Raises two frames down, inside a helper of its own, as a launcher does."""
    return _launch(q)


def _past_the_end(t, count):
    """``count`` elements of the memory right after ``t``'s last element, as a kernel with an
    unmasked load of the last, partial tile reads them. A read past a CPU tensor's storage would be
    undefined, so this stands in for one: it reads from the storage where the storage goes on past
    the tensor (the sanitize suite's guarded copies), and zeros where it does not (what lay past
    the end on the day: the numbers come out right)."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    start = t.storage_offset() + span
    storage = t.untyped_storage()
    if storage.nbytes() // t.element_size() - start < count:
        return torch.zeros(count, dtype=t.dtype, device=t.device)
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, start, (count,), (1,))


def reads_past_v(q, k, v, *, causal=False, scale=None):
    """Right numbers, and a read of one row past the end of v whose values are multiplied by a
    probability of zero: the commonest out-of-bounds bug of an attention kernel."""
    out = good(q, k, v, causal=causal, scale=scale)
    return out + 0 * _past_the_end(v, v.shape[-1]).float().sum().to(out.dtype)


def writes_past_q(q, k, v, *, causal=False, scale=None):
    """Right numbers, and a write of four elements past the end of its input q."""
    _past_the_end(q, 4).fill_(0)
    return good(q, k, v, causal=causal, scale=scale)


#: torch's own wording, as an H100 gave it for a 16k case (issue 41).
OUT_OF_MEMORY = ("CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
                 "which 10.34 GiB is free. Including non-PyTorch memory, this process has 68.84 GiB memory in use.")


def _other_workers():
    """The other worker processes of this worker's pytest run (on Linux: from /proc)."""
    parent, found = os.getppid(), 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (OSError, ValueError, IndexError):
            continue
        found += ppid == parent and b"pytest_attnkit.worker" in command
    return found


def crowded_out(q, k, v, *, causal=False, scale=None):
    """Runs out of device memory while any other worker of the run is alive, as a case that needs
    most of the GPU does beside other processes' CUDA contexts; right once it has the machine."""
    if _other_workers():
        raise torch.OutOfMemoryError(OUT_OF_MEMORY)
    return good(q, k, v, causal=causal, scale=scale)


def never_fits(q, k, v, *, causal=False, scale=None):
    """Runs out of device memory always: a case too big for the GPU even alone."""
    raise torch.OutOfMemoryError(OUT_OF_MEMORY)


def segfault(q, k, v, *, causal=False, scale=None):
    ctypes.string_at(0)


def aborts(q, k, v, *, causal=False, scale=None):
    os.abort()


def hangs(q, k, v, *, causal=False, scale=None):
    time.sleep(3600)


def wrong_on_113(q, k, v, *, causal=False, scale=None):
    """Right, except on 113 query rows, where the output is 10% too large."""
    out = good(q, k, v, causal=causal, scale=scale)
    return out * 1.1 if q.shape[-2] == 113 else out


def segfault_on_113(q, k, v, *, causal=False, scale=None):
    """Right, except that it kills its worker on 113 query rows."""
    if q.shape[-2] == 113:
        ctypes.string_at(0)
    return good(q, k, v, causal=causal, scale=scale)


def slow_but_wrong_on_1(q, k, v, *, causal=False, scale=None):
    """Wrong at once on a single query row; right after ATTNKIT_TEST_SLEEP seconds otherwise."""
    if q.shape[-2] == 1:
        return good(q, k, v, causal=causal, scale=scale) + 1.0
    time.sleep(float(os.environ.get("ATTNKIT_TEST_SLEEP", "2")))
    return good(q, k, v, causal=causal, scale=scale)


def _start_children():
    """Two processes that outlive the call: one in the worker's process group, and one that leaves
    it (setsid) through a parent that exits at once, as a daemon's double fork does."""
    child = subprocess.Popen(["sleep", "300"])
    subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '300'], "
                      "start_new_session=True)"]).wait()  # returns once the daemon's sleep runs
    if os.environ.get("ATTNKIT_TEST_CHILDREN"):  # says that it started them
        open(os.path.join(os.environ["ATTNKIT_TEST_CHILDREN"], str(child.pid)), "w").close()


def starts_children(q, k, v, *, causal=False, scale=None):
    """Correct, and starts processes that outlive each call (see _start_children)."""
    _start_children()
    return good(q, k, v, causal=causal, scale=scale)


def starts_children_and_crashes(q, k, v, *, causal=False, scale=None):
    """Starts processes that outlive the call (see _start_children), then kills its worker."""
    _start_children()
    ctypes.string_at(0)


def starts_children_and_hangs(q, k, v, *, causal=False, scale=None):
    """Starts processes that outlive the call (see _start_children), then hangs."""
    _start_children()
    time.sleep(3600)


_chatty_calls = 0


def chatty_then_segfault(q, k, v, *, causal=False, scale=None):
    """Right, printing a megabyte per call, until its worker's sixth call, which segfaults (a timing
    makes at least eight: one warm-up, one estimate and six samples of a call past 100 ms; the
    twelfth was not reached when a loaded machine made each call that long)."""
    global _chatty_calls
    _chatty_calls += 1
    sys.stdout.write(("debug: " + "x" * 120 + "\n") * 8192)
    if _chatty_calls == 6:
        ctypes.string_at(0)
    return good(q, k, v, causal=causal, scale=scale)


class HeadDim64Only(AttentionImpl):
    head_dims = (64,)
    supports_backward = False

    def forward(self, q, k, v, *, causal=False, scale=None):
        return good(q, k, v, causal=causal, scale=scale)


class NeedsFrobnicator(AttentionImpl):
    def unavailable_reason(self, device):
        return "needs a frobnicator (none found)"

    def forward(self, q, k, v, *, causal=False, scale=None):
        return good(q, k, v, causal=causal, scale=scale)


class NotAnImpl:
    pass


class ShortDtypeNames(AttentionImpl):
    """Declares dtypes by their short names, as the case ids print them: a typo that, unchecked,
    would skip every case and leave the run green."""

    dtypes = ("fp16", "bf16")

    def forward(self, q, k, v, *, causal=False, scale=None):
        return good(q, k, v, causal=causal, scale=scale)


class CapitalMemoryClass(AttentionImpl):
    memory_class = "Linear"
    devices = "cpu"

    def forward(self, q, k, v, *, causal=False, scale=None):
        return good(q, k, v, causal=causal, scale=scale)


INSTANCE = HeadDim64Only()
