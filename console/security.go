package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
)

const (
	csrfCookie    = "outbox_console_csrf"
	sessionCookie = "outbox_console_session"
)

// sign is the hex HMAC-SHA256 of parts under the console's key (a new key per process: a
// restart logs every operator out and voids every open form).
func (c *Console) sign(parts ...string) string {
	m := hmac.New(sha256.New, c.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}

// csrfToken returns the form token tied to the request's CSRF cookie, setting a new cookie
// when the request has none.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	v := ""
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) >= 16 {
		v = ck.Value
	} else {
		b := make([]byte, 18)
		_, _ = rand.Read(b)
		v = base64.RawURLEncoding.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	return c.sign("csrf", v)
}

// checkCSRF refuses a POST whose form token does not match its CSRF cookie.
func (c *Console) checkCSRF(r *http.Request) error {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || ck.Value == "" {
		return forbidden("missing CSRF cookie: reload the page and try again")
	}
	if !hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(c.sign("csrf", ck.Value))) {
		return forbidden("bad CSRF token: reload the page and try again")
	}
	return nil
}

// checkSameOrigin refuses a request that a browser marks as sent from another site: a
// Sec-Fetch-Site other than same-origin or none, or an Origin other than the console's own.
// Requests without either header (curl, scripts) pass on to the CSRF check.
func checkSameOrigin(r *http.Request) error {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return forbidden("cross-site request refused (Sec-Fetch-Site: " + s + ")")
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || o == "null" || !strings.EqualFold(u.Host, r.Host) {
			return forbidden("cross-site request refused (Origin: " + o + ")")
		}
	}
	return nil
}

// basicUser returns the user of a request that passes Config.BasicAuth.
func (c *Console) basicUser(r *http.Request) (string, bool) {
	u, p, ok := r.BasicAuth()
	if !ok {
		return "", false
	}
	want := []byte(c.sign("basic", c.cfg.BasicAuth))
	return u, subtle.ConstantTimeCompare([]byte(c.sign("basic", u+":"+p)), want) == 1
}

// actor returns who may act for r ("" when nobody: read-only console, or no valid token).
func (c *Console) actor(r *http.Request) string {
	switch {
	case c.cfg.BasicAuth != "":
		if u, ok := c.basicUser(r); ok {
			return u
		}
	case c.cfg.Token != "":
		want := c.sign("session", c.cfg.Token)
		if ck, err := r.Cookie(sessionCookie); err == nil && hmac.Equal([]byte(ck.Value), []byte(want)) {
			return "token"
		}
		if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok &&
			hmac.Equal([]byte(c.sign("session", b)), []byte(want)) {
			return "token"
		}
	}
	return ""
}

// action wraps an action's handler: it refuses cross-site requests, a read-only console, a
// request without the token or basic authentication, and a bad CSRF token, each with 403,
// before fn runs with the actor's name.
func (c *Console) action(fn func(w http.ResponseWriter, r *http.Request, who string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := checkSameOrigin(r)
		who := ""
		if err == nil {
			switch who = c.actor(r); {
			case c.ReadOnly():
				err = forbidden("this console is read-only: start it with --token or --basic-auth to act")
			case who == "":
				err = forbidden("log in with the operator token to act")
			default:
				err = c.checkCSRF(r)
			}
		}
		if err == nil {
			err = fn(w, r, who+"@"+r.RemoteAddr)
		}
		if err != nil {
			c.fail(w, r, err)
		}
	}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, "login", "Log in", nil)
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	err := checkSameOrigin(r)
	if err == nil {
		err = c.checkCSRF(r)
	}
	if err == nil && (c.cfg.Token == "" || !hmac.Equal([]byte(c.sign("session", r.PostFormValue("token"))), []byte(c.sign("session", c.cfg.Token)))) {
		err = forbidden("wrong token")
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: c.sign("session", c.cfg.Token), Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if err := checkSameOrigin(r); err != nil {
		c.fail(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}
