"""The Sanic application: routes, request ids, authentication, CORS, and the error envelope."""
