"""effectq for AI agents: steps (work safe to repeat, journaled by ordinal), tool sets whose
side-effecting tools are effects, and pydantic-ai model requests as steps.

* :mod:`effectq.agents.steps`: :func:`~effectq.step` (also ``effectq.step``).
* :mod:`effectq.agents.tools`: :func:`~effectq.wrap_tools` (also ``effectq.wrap_tools``).
* :mod:`effectq.agents.pydantic_ai`: ``DurableModel`` (needs ``pip install 'effectq[agents]'``).

``effectq.steps``, ``effectq.tools`` and ``effectq.pydantic_ai`` are the same, by their old paths.
"""
