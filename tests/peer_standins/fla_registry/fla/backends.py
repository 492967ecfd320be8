"""Stand-in for fla.backends: the registry's rules as fla 0.6.0 has them (priority order, lower first;
FLA_<TYPE> enables a whole type; the backend's switch, else its default; its package must be found;
its verifier must accept the call; a function it does not implement is skipped), and its dispatch
loop, which reads the registry's candidates at every call (what gdn's kernel log watches)."""

from __future__ import annotations

import importlib
import importlib.util
import os

_DISPATCH_DISABLED = os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") == "1"


class BaseBackend:
    backend_type = "base"
    package_name = None
    env_var = None
    default_enable = True
    priority = 5

    @classmethod
    def is_available(cls) -> bool:
        return cls.package_name is None or importlib.util.find_spec(cls.package_name) is not None

    def is_enabled(self) -> bool:
        if self.env_var is None:
            return True
        if os.environ.get(f"FLA_{self.backend_type.upper()}", "0") != "0":
            return True
        return os.environ.get(self.env_var, "1" if self.default_enable else "0") != "0"

    def get_implementation(self, function_name):
        return getattr(self, function_name, None)

    def verify(self, function_name, *args, **kwargs):
        verifier = getattr(self, f"{function_name}_verifier", None)
        if verifier is None:
            return True, None
        try:
            return verifier(*args, **kwargs)
        except Exception as error:
            return False, str(error)


class BackendRegistry:
    def __init__(self, operation_name):
        self.operation_name = operation_name
        self._backends = {}

    def register(self, backend):
        self._backends[backend.backend_type] = backend

    def _get_sorted_backends(self):
        return sorted(self._backends.values(), key=lambda backend: backend.priority)

    def dispatch(self, default_function):
        function_name = default_function.__name__

        def wrapper(*args, **kwargs):
            # the registry is read at every call, as fla's own loop reads it
            for backend in self._get_sorted_backends():
                if not (backend.is_available() and backend.is_enabled()):
                    continue
                accepted, _ = backend.verify(function_name, *args, **kwargs)
                if not accepted:
                    continue
                implementation = backend.get_implementation(function_name)
                if implementation is None:
                    continue
                return implementation(*args, **kwargs)
            return default_function(*args, **kwargs)

        return wrapper


_registries = {}


def _registry(operation):
    return _registries.setdefault(operation, BackendRegistry(operation))


def register(operation):
    def decorator(cls):
        _registry(operation).register(cls())
        return cls

    return decorator


def dispatch(operation):
    importlib.import_module(f"fla.ops.{operation}.backends")
    return _registry(operation).dispatch
