"""Measurement on a real model, in the CLI's own processes (no queue, no worker): counterfactual replay of stored
dense trajectories (``replay``, ``replay_run``, ``counterfactual``, ``replay_cells``, ``text_trajectories``), the
quality probes (``probes``), the action spans and their scores (``action_spans``, ``action_scores``), the cells
of a measurement fed as rows of one stack (``stacked_cells``) and the measuring processes that share a run
across cores (``processes``)."""
