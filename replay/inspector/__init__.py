"""`smg inspect`: a Textual browser over the request journal (list, filter, detail, replay, diff)."""

from replay.inspector.app import InspectorApp

__all__ = ["InspectorApp"]
