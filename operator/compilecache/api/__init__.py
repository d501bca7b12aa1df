"""The CompileCache API's one definition: the typed model (``model.py``) and ``make generate`` (``generate.py``).

Imported by the operator pod (``compilecache.controller``) and by the generator that writes the CRD
and docs/resource.md; it never imports JAX, kopf or the controller.
"""
