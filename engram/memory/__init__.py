"""The low floor: memory mappings that hold tables (mapping), what they cost (smaps), what a node can hold
(host), and their registration with the GPU (registration). Everything above may import these; they
import nothing of engram but errors."""
