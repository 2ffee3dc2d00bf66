"""The dashboard `spoolctl web` serves: a Starlette app over the services layer.

Imported only by that verb, from the optional `web` extra (Starlette, uvicorn,
Jinja2), so the core install and every other verb stay lean. Like the CLI it
runs no SQL of its own and never imports click: pages read the queue through
`spoolctl.services`, and actions change it through the same service functions
as `retry`, `cancel`, `pause` and `resume`.
"""
