"""A first zeptograd program: a fused elementwise chain and a reduce, each one kernel.

python examples/quickstart.py            # the results and the kernels that ran
DEBUG=4 python examples/quickstart.py    # ... and the C source of each kernel
"""

import numpy as np

from zeptograd import GlobalCounters, Tensor

a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
b = Tensor([1.0, 2.0, 3.0, 4.0])

GlobalCounters.reset()
c = ((a + b) * 2).relu()  # broadcasting; nothing runs yet
print("(a + b) * 2, relu:\n", c.numpy())
row_sums = (a * b).sum(axis=1)  # the multiply fuses into the reduce: one kernel
print("sum over rows of a * b:", row_sums.numpy())
softmax = (a - a.max(axis=1, keepdim=True)).exp()
softmax = softmax / softmax.sum(axis=1, keepdim=True)
print("softmax of each row:\n", softmax.numpy().round(4))
print(f"kernels run: {GlobalCounters.kernel_count}")
