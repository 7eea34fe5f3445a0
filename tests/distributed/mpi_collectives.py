"""An MPI job's rank (run by test_collectives.py): every collective against numpy, on CPU and on CL where PoCL is
here, and the errors. An AssertionError aborts the job (init's excepthook); the last line is `rank R ok`."""

import numpy as np

from zeptograd import Tensor, dtypes
from zeptograd import distributed as dist
from zeptograd.helpers import ArgumentError, ArgumentTypeError

assert not dist.is_initialized()
dist.init(timeout=60)
assert dist.is_initialized()
r, n = dist.rank(), dist.world_size()


def value(rank: int, dtype=np.float32) -> np.ndarray:
    return (np.arange(12).reshape(3, 4) * (rank + 1) - 5 * rank).astype(dtype)


every = np.stack([value(k) for k in range(n)])
a = Tensor(value(r))
for op, want in (("sum", every.sum(0)), ("mean", every.mean(0)), ("max", every.max(0))):
    got = dist.all_reduce(a, op)
    assert got.shape == (3, 4) and got.dtype == dtypes.float32 and got.device == a.device, (op, got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, err_msg=op)
np.testing.assert_array_equal(a.numpy(), value(r))  # the input is left as it was
# a lazy input (realized first), integers, booleans and bfloat16 (reduced as float32)
np.testing.assert_allclose(dist.all_reduce(a * 2 + 1).numpy(), (every * 2 + 1).sum(0), rtol=1e-6)
np.testing.assert_array_equal(dist.all_reduce(Tensor(value(r, np.int32)), "max").numpy(), every.max(0).astype(np.int32))
assert dist.all_reduce(Tensor([r == 1, False])).numpy().tolist() == [n > 1, False]
bf = dist.all_reduce(Tensor(value(r), dtype=dtypes.bfloat16))
assert bf.dtype == dtypes.bfloat16
np.testing.assert_allclose(bf.numpy(), every.sum(0), rtol=1e-2)
for root in range(n):
    got = dist.broadcast(a, root)
    np.testing.assert_array_equal(got.numpy(), value(root))
gathered = dist.all_gather(a[1:, ::2])  # a view: gathered as its values
assert gathered.shape == (n, 2, 2)
np.testing.assert_array_equal(gathered.numpy(), every[:, 1:, ::2])
dist.barrier()

# a device whose memory is not the host's goes through a host copy
try:
    from zeptograd.device import Device

    Device["CL"]
    has_cl = True
except Exception as e:  # no pyopencl, no OpenCL platform
    print(f"rank {r}: no CL here ({type(e).__name__}: {e})")
    has_cl = False
if has_cl:
    cl = Tensor(value(r), device="CL")
    got = dist.all_reduce(cl, "mean")
    assert got.device == "CL"
    np.testing.assert_allclose(got.numpy(), every.mean(0), rtol=1e-6)
    np.testing.assert_array_equal(dist.broadcast(cl, n - 1).numpy(), value(n - 1))
    print(f"rank {r}: CL checked")

# the ranks disagree: every rank raises, naming what each passed
messages = []
for call in (
    lambda: dist.all_reduce(Tensor.ones(3 + r)),
    lambda: dist.all_reduce(Tensor.ones(3, dtype=dtypes.float32 if r == 0 else dtypes.int32)),
    lambda: dist.all_reduce(Tensor.ones(3)) if r == 0 else dist.broadcast(Tensor.ones(3), 0),
    lambda: dist.all_reduce(Tensor.ones(3), "sum" if r == 0 else "max"),
):
    try:
        call()
    except ArgumentError as e:
        messages.append(str(e))
    else:
        raise AssertionError("no error for a mismatch")
assert "rank 0 called all_reduce (op 'sum') of shape (3,) dtypes.float" in messages[0], messages[0]
assert "rank 1 called all_reduce (op 'sum') of shape (4,) dtypes.float" in messages[0], messages[0]
assert "rank 1 called all_reduce (op 'sum') of shape (3,) dtypes.int" in messages[1], messages[1]
assert "rank 1 called broadcast (root 0) of shape (3,)" in messages[2], messages[2]
assert "rank 1 called all_reduce (op 'max')" in messages[3], messages[3]
# bad arguments are errors at the call, before anything is sent
for call, kind in (
    (lambda: dist.all_reduce(Tensor.ones(2), "min"), ArgumentError),
    (lambda: dist.all_reduce(Tensor([1, 2]), "mean"), ArgumentTypeError),
    (lambda: dist.broadcast(Tensor.ones(2), n), ArgumentError),
    (lambda: dist.all_reduce(np.ones(2)), ArgumentTypeError),
):
    try:
        call()
    except kind:
        pass
    else:
        raise AssertionError(f"no {kind.__name__}")
# the ranks still agree after the errors
np.testing.assert_allclose(dist.all_reduce(Tensor([1.0])).numpy(), [n])
print(f"rank {r} ok")
