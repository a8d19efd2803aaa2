"""Studies: a grid of arms x paired seeds run as ordinary runs, and a report that compares them."""
