package template

import (
	_ "embed"
	"slices"
)

// DesktopName is the template E2B's desktop SDK (@e2b/desktop) asks for.
const DesktopName = "desktop"

// DesktopMemoryMB is the desktop template's default memory limit. The
// agent's limit holds what gVisor's sentry charges the sandbox (each page
// once, shared libraries included): Xvfb and an idle Xfce session count
// about 310 MiB, Firefox showing one page brings it to about 910 MiB
// (the host cgroup charge: 150 and 540 MiB). 2 GiB leaves Firefox room
// for heavier pages.
const DesktopMemoryMB = 2048

// desktopStream is /usr/local/bin/cella-desktop-stream in the desktop
// image: what the SDK's Sandbox.create() and stream.start() run, for a
// sandbox no SDK started (the console's desktop view).
//
//go:embed desktop/cella-desktop-stream
var desktopStream string

// DesktopRecipe is base plus what @e2b/desktop drives over ordinary
// commands: it starts `Xvfb :0` and `startxfce4` itself at create (the
// template starts nothing, so an idle sandbox that no SDK drove costs what
// base does), waits with xdpyinfo and pgrep, takes screenshots with
// `scrot --pointer`, moves and types with xdotool, reads the screen size
// from xrandr, opens with xdg-open and gtk-launch, and streams with x11vnc
// plus noVNC's novnc_proxy, which it runs from /opt/noVNC/utils (Debian's
// novnc lives in /usr/share/novnc, hence the link) and waits for with
// netstat. Firefox ESR is the browser, Mousepad the text editor.
var DesktopRecipe = Recipe{
	Suite: BaseRecipe.Suite,
	Packages: append(slices.Clone(BaseRecipe.Packages),
		// X server, the tools the SDK runs, and the session bus Xfce wants.
		"xvfb", "x11-utils", "x11-xserver-utils", "xauth", "xdotool", "scrot",
		"dbus", "dbus-x11", "xdg-utils", "libgtk-3-bin", "net-tools",
		// Xfce: the session, window manager, desktop and panel the SDK
		// waits for (xfce4-session, xfwm4, xfdesktop).
		"xfce4-session", "xfwm4", "xfdesktop4", "xfce4-panel", "xfce4-settings", "xfconf",
		"xfce4-terminal", "thunar", "adwaita-icon-theme",
		// The stream: VNC server and noVNC behind websockify.
		"x11vnc", "novnc", "websockify", "python3-websockify",
		// Applications and fonts.
		"firefox-esr", "mousepad", "fonts-dejavu-core", "fonts-liberation2"),
	Files: []RecipeFile{
		{Path: "/opt/noVNC", Link: "/usr/share/novnc"},
		// debootstrap's minbase writes no /etc/hosts, so `localhost` does
		// not resolve (the SDK points noVNC at localhost:5900), nor does the
		// hostname every sandbox gets (cella), which Firefox looks up.
		{Path: "/etc/hosts", Content: "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tcella\n"},
		// A system-wide panel configuration: without one the panel opens
		// its "first start" dialog over the desktop of every sandbox.
		{Path: "/etc/xdg/xfce4/xfconf/xfce-perchannel-xml/xfce4-panel.xml", CopyOf: "/etc/xdg/xfce4/panel/default.xml"},
		{Path: "/usr/local/bin/cella-desktop-stream", Content: desktopStream, Mode: 0o755},
	},
}
