"""One-step probes: what a single update of each method does, from one fixed starting point, measured over
hundreds of paired replicates (thinkrl probe; docs/studies.md, "One-step probes")."""
