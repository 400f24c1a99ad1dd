"""The tools around the plugin: the command line (``plan``, ``doctor``, ``bench``,
``check``), the test bed of real vLLM objects, and the contract model of the asm kernel.

The runtime that vLLM loads in every process (the rest of this package) never imports
anything from here.
"""
