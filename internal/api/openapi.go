package api

import (
	_ "embed"
	"net/http"

	"github.com/gin-gonic/gin"
)

// OpenAPI is the API's OpenAPI 3 document, served at /openapi.yaml. Tests
// check that every route in it exists and that responses match it.
//
//go:embed openapi.yaml
var OpenAPI []byte

func (s *Server) openapi(c *gin.Context) {
	c.Data(http.StatusOK, "application/yaml", OpenAPI)
}
