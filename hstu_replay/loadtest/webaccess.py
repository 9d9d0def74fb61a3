"""Who can reach a Locust process: loopback by default, Locust's own login for anything wider.

Locust binds its web UI and a master's port to every interface unless told otherwise; here both
default to 127.0.0.1 (`loadtest.options.LOCUST_OWN`), and `--web-host` / `--master-bind-host`
given explicitly bind wider. With `--web-login` the web UI asks for `--web-user` and
`--web-password` (read from the command line or `LOCUST_WEB_PASSWORD`; never shown, logged or
sent to workers); both are declared with the other options (`loadtest.options.WEB_OPTIONS`).
"""

from __future__ import annotations

import hmac
import secrets
import sys

from hstu_replay.errors import ConfigError
from hstu_replay.loadtest.options import WEB_PASSWORD, WEB_USER

LOGIN_CALLBACK = "/hstu/login"


def take_credentials(parsed) -> tuple[str, str]:
    """The login's user and password, removed from the parsed options (a master sends those to
    every worker)."""
    user = getattr(parsed, WEB_USER.dest, "") or WEB_USER.default
    password = getattr(parsed, WEB_PASSWORD.dest, "") or ""
    setattr(parsed, WEB_PASSWORD.dest, "")
    return user, password


def install_login(environment, user: str, password: str) -> None:
    """Locust's --web-login page, answered by a user name and password check."""
    web_ui = environment.web_ui
    if not web_ui.web_login:
        return
    if not password:
        print(f"hstu-replay: error: --web-login needs {WEB_PASSWORD.flag} (or {WEB_PASSWORD.env_var})", file=sys.stderr,
              flush=True)
        sys.exit(ConfigError.exit_code)
    from flask import redirect, request, session, url_for
    from flask_login import UserMixin, current_user, login_user

    class WebUser(UserMixin):
        def __init__(self, name: str):
            self.id = name

    web_ui.app.secret_key = secrets.token_bytes(32)  # sessions live as long as this process
    web_ui.login_manager.user_loader(lambda name: WebUser(name) if name == user else None)
    web_ui.auth_args = {"username_password_callback": LOGIN_CALLBACK, "title": "hstu-replay"}

    @web_ui.app.before_request
    def hstu_pages_need_the_login_too():  # the tab's own pages (/hstu/...), not Locust's routes
        if request.path.startswith("/hstu/") and request.path != LOGIN_CALLBACK and not current_user.is_authenticated:
            return redirect(url_for("locust.login"))
        return None

    @web_ui.app.route(LOGIN_CALLBACK, methods=["POST"])
    def login_submit():
        given_user, given_password = request.form.get("username", ""), request.form.get("password", "")
        if hmac.compare_digest(given_user.encode(), user.encode()) and \
                hmac.compare_digest(given_password.encode(), password.encode()):
            login_user(WebUser(user))
            return redirect(url_for("locust.index"))
        session["auth_error"] = "Invalid user name or password"
        return redirect(url_for("locust.login"))
