"""Name rules: which module type each parameter of a model family is (``modules``), rules
read off a model's own names when no rule set fits (``inference``), and rules carried over
to another model (``retarget``)."""
