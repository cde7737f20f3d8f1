"""pagedserve's shared package: what no single service owns.

    protocol/    the vocabulary that crosses services (block ops, limits, sampling parameters,
                 finish reasons) and its proto codecs
    common/      cross-service plumbing: server bootstrap, auth, TLS channels, health, logging,
                 error mapping, flag parsing
    supervisor/  starting and stopping the services and redis-server as child processes
    cli/         `pagedserve` (up, generate, the services) and `pagedctl` (the admin CLI)
    gateway_client.py   the Python client of the Gateway API
    allocator/v1/, executor/v1/, gateway/v1/   stubs generated from protos/ by `make protos`
                 (never edited by hand)

protocol/ and common/ import no service; cli/ and supervisor/ put the services together.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pagedserve")
except PackageNotFoundError:    # run from a checkout that is not installed (a GPU machine)
    __version__ = "0+unknown"
