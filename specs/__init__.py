"""The spec pages, installed with leaseproof as `leaseproof.specs`: a package of data alone.

Installed, they let `leaseproof spec --check` check the pages against the model
outside a checkout; `leaseproof path specs` prints where they are.
"""
