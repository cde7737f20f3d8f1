"""Starting and stopping pagedserve's processes: the services themselves and a real
`redis-server`. One supervisor serves `pagedserve up`, the tests and the benchmarks."""
