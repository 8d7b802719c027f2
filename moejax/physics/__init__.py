"""Layer 2 of DESIGN.md: roofline, links (Eq. 1), topologies, collectives."""
