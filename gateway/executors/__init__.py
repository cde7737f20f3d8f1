"""The gateway's side of the executors: which exist and what they serve (the directory), one
Session stream to each (the link), and which one a request goes to (the router)."""
