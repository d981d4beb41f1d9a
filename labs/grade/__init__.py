"""Grade a gateway or an OpenAI-compatible server: a report card, as a command and as a pytest plugin.

- `labs.grade.card`: the card (checks' rows, marks, exit status), as data.
- `labs.grade.reading`: one response read with finishline's repair core (the judge of well-formed);
  `labs.grade.dialect_reading`: what a Messages, Responses or Gemini answer carried.
- `labs.grade.fetch`: asking the target (identity bodies, as they came off the wire), for both graders.
- `labs.grade.server_checks` (Chat, and what every dialect shares), `server_checks_messages`,
  `server_checks_responses`, `server_checks_gemini`, `server_suites` (all four by dialect),
  `labs.grade.server_grader`: `python -m labs.grade server [--dialect chat|messages|responses|gemini]`.
- `labs.grade.gateway_checks`, `labs.grade.gateway_plan`, `labs.grade.gateway_grader`:
  `python -m labs.grade gateway`.
- `labs.grade.render`: the card for a terminal, as JSON, as HTML, and cards side by side (Markdown).
- `labs.grade.cli`: the command line (also `finishline grade`); `labs.grade.pytest_plugin`: the same checks as pytest tests, loaded on first use by the plugin entry `finishline.pytest_plugin`.
"""
