from verl.single_controller.ray.base import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

__all__ = ["RayClassWithInitArgs", "RayResourcePool", "RayWorkerGroup"]
