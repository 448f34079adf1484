from verl.single_controller.base.decorator import Dispatch, DispatchMode, Execute, register, register_dispatch_mode
from verl.single_controller.base.worker import Worker

__all__ = ["Dispatch", "DispatchMode", "Execute", "Worker", "register", "register_dispatch_mode"]
