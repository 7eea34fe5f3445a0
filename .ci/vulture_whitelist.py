"""Names the dead-code check (vulture) must not report: each is used from outside the repository's own code.

Read by `.ci/run` as `vulture zeptograd tests examples bench .ci/vulture_whitelist.py`; only findings inside
zeptograd/ fail CI (tests and bench keep helpers that pytest or the harness find by name).
"""

_ = object()

# public API that users call and the repository's own code does not (tinygrad's and torch's names)
_.char, _.uchar, _.ushort, _.uint, _.ulong  # dtypes aliases
_.byte, _.clone, _.to_, _.contiguous_backward, _.inference_mode, _.test  # Tensor methods, Tensor.train modes
_.nbytes_scalar  # DType
_.run_schedule  # engine.realize: run a list of ScheduleItems (tinygrad's name)
_.sorted_  # Tensor.topk's keyword (`sorted` is a builtin)
_.do_update_stats  # Tensor.replace's keyword, accepted for tinygrad's signature

# protocols the interpreter or a library calls
_.exc, _.objtype  # __exit__ and __get__ parameters
_.find_class, _.persistent_load, _.backward_hooks  # pickle.Unpickler hooks, torch's _rebuild_tensor_v2 signature
_._print_match_stats  # registered with atexit
_.cl_device, _.data_layout  # pyopencl device kept alive; llvmlite module
_.__getattr__  # the package's lazy attributes (PEP 562: the interpreter calls it)
_.do_GET, _.log_message  # http.server's request handler hooks (zeptograd/viz/server.py)

# read by tests and bench, and knobs reserved for work in progress
_.uncacheable  # schedule cache statistics
_.BUFFERIZE  # explicit BUFFERIZE nodes (the scheduler rework)
