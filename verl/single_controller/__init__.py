"""Single controller: the driver calls a method on a group of Ray workers as if it were one local object.

`base` holds what runs inside a worker (`Worker`, `@register`, `Dispatch`); `ray` holds the driver side
(`RayResourcePool`, `RayClassWithInitArgs`, `RayWorkerGroup`).
"""
