"""The broker's worker side: what a worker (or the dramatiq CLI) runs to claim jobs, hold
them, run them under the Fence and write their outcomes, with the threads that serve it
(ARCHITECTURE.md, "The broker's parts"). It never imports the producer (lint-imports)."""
