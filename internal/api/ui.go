package api

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/internal/ui"
)

// uiCSP is the dashboard's Content-Security-Policy: its own script and
// style only (no inline code, so injected markup cannot run), requests to
// this origin only, and no framing, against clickjacking.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// mountUI serves the dashboard (internal/ui) at /ui/, redirects / there,
// and adds its sign-in resource. The files are public: what they show
// comes from the v1 API, behind the keys.
func (s *Server) mountUI(e *gin.Engine) {
	redirect := func(c *gin.Context) { c.Redirect(http.StatusFound, ui.Path) }
	e.GET("/", redirect)
	e.GET("/ui", redirect)
	for _, f := range ui.Files() {
		p := ui.Path + f.Name
		if f.Name == "index.html" {
			p = ui.Path
		}
		serve := func(c *gin.Context) {
			h := c.Writer.Header()
			h.Set("Content-Security-Policy", uiCSP)
			h.Set("X-Content-Type-Options", "nosniff")
			h.Set("X-Frame-Options", "DENY")
			h.Set("Referrer-Policy", "no-referrer")
			h.Set("Cache-Control", "no-cache")
			h.Set("ETag", f.ETag)
			if c.GetHeader("If-None-Match") == f.ETag {
				c.Status(http.StatusNotModified)
				return
			}
			c.Data(http.StatusOK, f.ContentType, f.Body)
		}
		// HEAD too, as a static file server answers it (net/http sends
		// the head without the body): link checkers and uptime probes
		// use it.
		e.GET(p, serve)
		e.HEAD(p, serve)
	}
	g := e.Group(SessionPath, s.timeout())
	g.GET("", s.getSession)
	g.POST("", s.createSession)
	g.DELETE("", s.deleteSession)
}
