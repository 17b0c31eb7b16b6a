"""The row vocabulary, on the ground floor: the lifecycle states of a claimable row
(:mod:`.status`) and the shape of a claimed row as the library's modules use it
(:mod:`.claimable`). Imports nothing of the package, so every layer may use it."""
