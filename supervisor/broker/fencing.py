"""The path users import the Fence and LeaseLost by (docs/flow-control.md, docs/delivery.md:
``add_middleware(..., before=Fence)``); the module is the worker side's, consuming/fencing.py."""

from .consuming.fencing import Fence, LeaseLost

__all__ = ["Fence", "LeaseLost"]
