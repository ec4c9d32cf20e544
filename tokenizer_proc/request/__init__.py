"""Request building, shared by every API surface: checked bodies to `GenerateReq` messages
(`builder`), chat templates, fill-in-the-middle, refused fields, ``n`` choices and running a built
request for a route (`choices`, `route_run`)."""
