"""Template tags of the durable admin pages: the breadcrumb trail in the running admin's own markup."""

from functools import cache

from django import template
from django.template.loader import get_template
from django.template.loader_tags import BlockNode
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext

register = template.Library()


@cache
def admin_trail_is_a_list() -> bool:
    """Return whether the admin's own `breadcrumbs` block is an `<ol>` of `<li>` (Django 6.1) or a `<div>`.

    Read from the block of `admin/base.html` as the project loads it (a theme that overrides it
    counts), not from Django's version: the durable pages take the markup of the pages around them.
    """
    source = get_template("admin/base.html").template
    for node in source.nodelist.get_nodes_by_type(BlockNode):
        if node.name == "breadcrumbs":
            return "<ol" in "".join(getattr(child, "s", "") for child in node.nodelist)
    return False


@register.simple_tag
def durable_breadcrumbs(*crumbs):
    """Return the trail Home › crumbs… as the admin's own pages draw it.

    `crumbs` alternate a label and its address, and end with the current page's label alone:
    `{% durable_breadcrumbs app_name app_url "Overview" %}`. An empty address draws a label
    without a link.
    """
    *linked, current = crumbs
    links = [(gettext("Home"), reverse("admin:index"))]
    links += list(zip(linked[0::2], linked[1::2], strict=True))
    if admin_trail_is_a_list():
        # One item a line, as Django writes them: the space between items is part of the look.
        items = format_html_join("\n", "<li>{}</li>", ((_link(label, url),) for label, url in links))
        return format_html('<ol class="breadcrumbs">\n{}\n<li aria-current="page">{}</li>\n</ol>', items, current)
    trail = mark_safe(" &rsaquo; ".join(str(_link(label, url)) for label, url in links))
    return format_html('<div class="breadcrumbs">{} &rsaquo; {}</div>', trail, current)


def _link(label, url):
    return format_html('<a href="{}">{}</a>', url, label) if url else format_html("{}", label)
