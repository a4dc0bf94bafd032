"""The gunicorn seam: the settings `make run` serves with, and the gthread worker that reads each request whole in
its event loop (httptools: llhttp) before a thread serves it. `api/` knows HTTP requests as Flask sees them; this
package knows gunicorn."""
