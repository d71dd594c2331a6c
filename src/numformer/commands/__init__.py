"""Sub-commands of the ``numformer`` CLI, one module each, discovered by ``numformer.cli``."""
