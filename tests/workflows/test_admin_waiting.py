"""The admin's change page of a waiting row names the prerequisites it still waits for."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.support.testapp.models import Document, Step


@pytest.mark.django_db
def test_a_waiting_rows_page_names_its_open_prerequisites(admin_client):
    done, open_ = Step.objects.create(name="done"), Step.objects.create(name="open")
    Step.objects.filter(pk=done.pk).claim_next().complete()
    waiting = Document.objects.create(title="waits", after=[done, open_])
    html = admin_client.get(reverse("admin:testapp_document_change", args=[waiting.pk]))
    text = html.content.decode()
    assert "Waiting for" in text
    assert f"testapp.Step #{open_.pk}" in text
    assert f"testapp.Step #{done.pk}" not in text
    ready = Document.objects.create(title="plain")
    page = admin_client.get(reverse("admin:testapp_document_change", args=[ready.pk]))
    assert "Waiting for" not in page.content.decode()


@pytest.mark.django_db
def test_a_prerequisites_page_names_the_rows_that_wait_for_it(admin_client):
    first = Step.objects.create(name="first")
    waiting = [Document.objects.create(title=f"waits {i}", after=[first]) for i in range(22)]
    url = reverse("admin:testapp_step_change", args=[first.pk])
    text = admin_client.get(url).content.decode()
    assert "Rows waiting for it" in text
    assert "22 waiting for it: " in text
    assert f"testapp.Document #{waiting[0].pk}," in text
    assert f"testapp.Document #{waiting[21].pk}" not in text  # past the first 20
    assert "(2 more)" in text
    Step.objects.filter(pk=first.pk).claim_next().complete()  # releases all 22
    text = admin_client.get(url).content.decode()
    assert "22 released or settled by it" in text
    assert "22 waiting for it" not in text
    # a row nothing waits for shows the line empty; a model without dependents not at all
    other = Step.objects.create(name="alone")
    text = admin_client.get(reverse("admin:testapp_step_change", args=[other.pk])).content
    assert "Rows waiting for it" in text.decode()
    doc_page = admin_client.get(reverse("admin:testapp_document_change", args=[waiting[0].pk]))
    assert "Rows waiting for it" not in doc_page.content.decode()
