"""STAND-IN for fla_npu.ops (tests/standins), NOT the real package."""

__all__ = ["ascendc"]
