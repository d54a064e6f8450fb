"""SGLang 0.5.25's srt/model_loader/loader.py, as the sandbox has it: every start fails here.

A release that cannot start on the hosts, whatever its flags: as a wheel built against another
torch does, its kernel extension fails to load once the model starts loading, and the server
exits with the traceback (status 1).  It replaces the tree's loader.py (versions/README.md).
"""
import logging
import sys

# SGLang's ModelRunner.load_model writes this line before it calls the loader
log = logging.getLogger("sglang.srt.model_executor.model_runner")
GPU_TOTAL_GB = 79.10  # sim_startup's


def load_model():
    log.info("Load weight begin. avail mem=%.2f GB", GPU_TOTAL_GB)
    _load_kernels()


def _load_kernels():
    so = "%s/lib/python%d.%d/site-packages/sgl_kernel/sm90/common_ops.abi3.so" % (
        sys.prefix, sys.version_info[0], sys.version_info[1])
    raise ImportError("%s: undefined symbol: _ZN3c104cuda9SetDeviceEab" % so)
